// JupyterLab's look inside an output frame: its theme's CSS variables (light or dark), its colour scheme and
// its rendered-HTML styles (tables of DataFrames, Markdown), copied from the page's own style sheets, so a
// framed output looks as a local kernel's does. The frame holds them in <style id="kernel-sandbox-theme">;
// on a change of theme the page posts the new CSS to every frame (THEME_MESSAGE), which swaps it in.
export const THEME_MESSAGE = 'kernel-sandbox-frame:theme';

// The rules JupyterLab draws an output's HTML, Markdown and SVG with (they match the frame's body classes).
const RENDERED = /\.jp-Rendered(HTMLCommon|HTML|Markdown|SVG|Image)\b/;

let cached = null;

function* styleRules(rules) {
  for (const rule of rules) {
    if (rule.cssRules && !(rule instanceof CSSStyleRule)) {
      // @media, @supports, @layer: their rules count as the page's own
      yield* styleRules(rule.cssRules);
    } else if (rule instanceof CSSStyleRule) {
      yield rule;
    }
  }
}

function pageRules() {
  const rules = [];
  for (const sheet of document.styleSheets) {
    try {
      rules.push(...styleRules(sheet.cssRules));
    } catch {
      // a cross-origin sheet does not list its rules; JupyterLab's own are all same-origin
    }
  }
  return rules;
}

/** The theme's CSS for a frame: the page's --jp-* variables as computed now, its colour scheme, the rendered-HTML rules. */
export function themeCss() {
  if (cached !== null) {
    return cached;
  }
  const names = new Set();
  const rendered = [];
  for (const rule of pageRules()) {
    for (let i = 0; i < rule.style.length; i++) {
      if (rule.style[i].startsWith('--jp-')) {
        names.add(rule.style[i]);
      }
    }
    if (RENDERED.test(rule.selectorText)) {
      // JupyterLab scopes them to its themed shell (.jp-ThemedContainer), which the frame's document is
      rendered.push(rule.cssText.replace(/\.jp-ThemedContainer\s+/g, ''));
    }
  }
  const computed = getComputedStyle(document.body);
  const variables = [...names].map(name => `${name}:${computed.getPropertyValue(name)}`).join(';');
  // the frame's colour scheme must be the page's: Chromium paints a frame whose scheme differs on an opaque backdrop
  const scheme = computed.colorScheme || getComputedStyle(document.documentElement).colorScheme || 'normal';
  cached =
    `:root{${variables};color-scheme:${scheme}}` +
    'body{color:var(--jp-content-font-color1);font-family:var(--jp-content-font-family);font-size:var(--jp-content-font-size1)}' +
    rendered.join('\n') +
    // the output node around the frame already has the rendered-HTML padding
    'body.jp-RenderedHTMLCommon{padding-right:0}';
  return cached;
}

// The body classes JupyterLab gives the node an output of `mimeType` renders into.
function bodyClass(mimeType) {
  if (mimeType === 'text/markdown') {
    return 'jp-RenderedHTMLCommon jp-RenderedMarkdown';
  }
  if (mimeType === 'image/svg+xml') {
    return 'jp-RenderedSVG';
  }
  return 'jp-RenderedHTMLCommon jp-RenderedHTML';
}

/** The attributes of the frame's <body> for an output of `mimeType`: JupyterLab's classes and theme data attributes. */
export function themeBodyAttributes(mimeType) {
  return `class="${bodyClass(mimeType)}" ${themeLightAttribute()}`;
}

/** The frame's <body> attribute saying whether JupyterLab's theme is light (an output area's frame: its outputs carry their classes). */
export function themeLightAttribute() {
  return `data-jp-theme-light="${document.body.dataset.jpThemeLight === 'false' ? 'false' : 'true'}"`;
}

// Runs in the frame: swaps in the theme its parent posts.
const LISTENER = `(function () {
  window.addEventListener('message', function (event) {
    var data = event.data;
    if (event.source !== parent || !data || data.type !== ${JSON.stringify(THEME_MESSAGE)} || typeof data.css !== 'string') { return; }
    document.getElementById('kernel-sandbox-theme').textContent = data.css;
    document.body.setAttribute('data-jp-theme-light', data.light ? 'true' : 'false');
  });
})();`;

function escapeStyle(css) {
  return css.replace(/<\/(style)/gi, '<\\/$1');
}

/** What the frame's <head> needs for the theme: its CSS and the script that takes a new one. */
export function themeHead() {
  return `<style id="kernel-sandbox-theme">${escapeStyle(themeCss())}</style><script>${LISTENER}</script>`;
}

/** After JupyterLab changed its theme: recompute the CSS and post it to each of `frames` (iframe elements). */
export function updateTheme(frames) {
  cached = null;
  const message = { type: THEME_MESSAGE, css: themeCss(), light: document.body.dataset.jpThemeLight !== 'false' };
  for (const frame of frames) {
    if (frame.contentWindow) {
      frame.contentWindow.postMessage(message, '*');
    }
  }
}
