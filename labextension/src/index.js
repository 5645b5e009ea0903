// kernel-sandbox-frame: the rich outputs of sandboxed kernels render in opaque-origin iframes.
//
// For every notebook and console, each renderer of a mime type that can run script or lay out HTML
// is wrapped: when what it draws (an output, a tooltip, the inspector's help: anything but a Markdown
// cell's own source) comes from a kernel whose kernelspec names a kernel-sandbox provisioner, or whose
// kernelspec is not known (fail closed), it is drawn inside
// <iframe sandbox="allow-scripts"> (no allow-same-origin: an opaque origin, so no cookie, no
// same-origin request, no access to the page) whose document forbids every network load by its CSP.
// Other kernels' outputs render as before. The frame reports its height by postMessage.
//
// A second plugin adds the command "Restart Kernel, Keep Variables" for notebooks on a sandboxed kernel:
// %checkpoint (the launcher keeps the blob on the host), a restart, then %restore in the new kernel.
import { Dialog, ICommandPalette, IThemeManager, Notification, showDialog } from '@jupyterlab/apputils';
import { IConsoleTracker } from '@jupyterlab/console';
import { INotebookTracker, INotebookWidgetFactory } from '@jupyterlab/notebook';
import { ITooltipManager } from '@jupyterlab/tooltip';
import { Widget } from '@lumino/widgets';
import { PLOTLY_MIME, plotlyBody } from './plotly';
import { PNG_FRAME_POST } from './png';
import { themeBodyAttributes, updateTheme, usableHandlers, usableHead } from './usable';

const PROVISIONERS = new Set(['kernel-sandbox-docker', 'kernel-sandbox-opensandbox']);
// Rendered by JupyterLab without script or page-wide layout: left as they are.
const INERT = new Set([
  'text/plain',
  'application/vnd.jupyter.stdout',
  'application/vnd.jupyter.stderr',
  'image/png',
  'image/jpeg',
  'image/gif',
  'image/bmp',
  'image/webp',
  'text/latex',
  'application/vnd.jupyter.widget-view+json'
]);
const VEGA = /^application\/vnd\.vega(lite)?\.v\d+\+json$/;
const HEIGHT_MESSAGE = 'kernel-sandbox-frame:height';
const MAX_HEIGHT = 20000;
const CSP = [
  "default-src 'none'",
  "script-src 'unsafe-inline' 'unsafe-eval'",
  "style-src 'unsafe-inline'",
  'img-src data: blob:',
  'font-src data:',
  "form-action 'none'",
  "base-uri 'none'"
].join('; ');

// The frames this extension made (a frame's window changes when JupyterLab re-attaches it).
const ours = new WeakSet();

function frameOf(source) {
  for (const frame of document.querySelectorAll('iframe.kernel-sandbox-frame')) {
    if (frame.contentWindow === source && ours.has(frame)) {
      return frame;
    }
  }
  return null;
}

function ourFrames() {
  return [...document.querySelectorAll('iframe.kernel-sandbox-frame')].filter(frame => ours.has(frame));
}

let handlers = {};

function onMessage(event) {
  const data = event.data;
  if (event.origin !== 'null' || !data || typeof data !== 'object') {
    return;
  }
  const frame = frameOf(event.source);
  if (frame && Object.prototype.hasOwnProperty.call(handlers, data.type)) {
    handlers[data.type](frame, data);
  }
  const height = data.height;
  if (data.type !== HEIGHT_MESSAGE || !frame || typeof height !== 'number' || !Number.isFinite(height) || height < 0) {
    return;
  }
  frame.style.height = `${Math.ceil(Math.min(height, MAX_HEIGHT))}px`;
}

function escapeScript(source) {
  return source.replace(/<\/(script)/gi, '<\\/$1');
}

function escapeText(text) {
  return text.replace(/[&<>"']/g, c => `&#${c.charCodeAt(0)};`);
}

// Sends the document's height to the parent on load and on every change of size.
const REPORTER = `(function () {
  function report() {
    var height = Math.max(document.documentElement.scrollHeight, document.body ? document.body.scrollHeight : 0);
    parent.postMessage({ type: ${JSON.stringify(HEIGHT_MESSAGE)}, height: height }, '*');
  }
  new ResizeObserver(report).observe(document.documentElement);
  window.addEventListener('load', report);
  report();
})();`;

function frameDocument(body, mimeType) {
  return (
    '<!DOCTYPE html><html><head><meta charset="utf-8">' +
    `<meta http-equiv="Content-Security-Policy" content="${CSP}">` +
    '<style>html,body{margin:0;padding:0;background:transparent;overflow-y:hidden}body{padding:2px 0}</style>' +
    `${usableHead()}<script>${REPORTER}</script></head><body ${themeBodyAttributes(mimeType)}>${body}</body></html>`
  );
}

let vegaSource = null;

async function vegaBody(mimeType, spec) {
  if (vegaSource === null) {
    vegaSource = (await import('./vega-source.js')).default;
  }
  const mode = mimeType.includes('vegalite') ? 'vega-lite' : 'vega';
  // no loader (data URLs fail), no usermeta (it carries embed options), no actions (no View Source)
  const embed = `(function () {
  var spec = ${escapeScript(JSON.stringify(spec))};
  if (spec && typeof spec === 'object') { delete spec.usermeta; }
  var refuse = function () { return Promise.reject(new Error('kernel-sandbox: a chart from a sandboxed kernel loads nothing')); };
  var loader = vega.loader();
  loader.load = refuse; loader.sanitize = refuse; loader.http = refuse; loader.file = refuse;
  vegaEmbed(document.getElementById('chart'), spec, { mode: ${JSON.stringify(mode)}, actions: false, loader: loader })
    .then(function (result) { (${PNG_FRAME_POST})(result.view.toImageURL('png')); })
    .catch(function (error) { document.getElementById('chart').textContent = String(error && error.message || error); });
})();`;
  return `<div id="chart"></div><script>${vegaSource}</script><script>${embed}</script>`;
}

function text(value) {
  return Array.isArray(value) ? value.join('') : typeof value === 'string' ? value : JSON.stringify(value);
}

async function frameBody(mimeType, model, options) {
  const data = model.data;
  const value = data[mimeType];
  if (mimeType === 'text/html' || mimeType === 'image/svg+xml') {
    return text(value);
  }
  if (mimeType === 'text/markdown') {
    const source = text(value);
    return options.markdownParser ? await options.markdownParser.render(source) : `<pre>${escapeText(source)}</pre>`;
  }
  if (mimeType === 'application/javascript' || mimeType === 'text/javascript') {
    return `<div id="output"></div><script>var element = document.getElementById('output');\n${escapeScript(text(value))}</script>`;
  }
  if (VEGA.test(mimeType)) {
    return vegaBody(mimeType, value);
  }
  if (mimeType === PLOTLY_MIME) {
    return plotlyBody(value);
  }
  // a mime type whose renderer we do not know (Bokeh, PDF...): its HTML form, else its text
  if (data['text/html'] !== undefined) {
    return text(data['text/html']);
  }
  const plain = data['text/plain'] !== undefined ? text(data['text/plain']) : `[${mimeType} output of a sandboxed kernel]`;
  return `<pre>${escapeText(plain)}</pre>`;
}

async function renderInFrame(renderer, mimeType, model, options) {
  const body = await frameBody(mimeType, model, options);
  const frame = document.createElement('iframe');
  frame.setAttribute('sandbox', 'allow-scripts');
  frame.setAttribute('referrerpolicy', 'no-referrer');
  frame.setAttribute('title', 'output of a sandboxed kernel');
  frame.className = 'kernel-sandbox-frame';
  frame.style.cssText = 'width:100%;height:24px;border:0;display:block;background:transparent';
  frame.srcdoc = frameDocument(body, mimeType);
  const node = renderer.node;
  while (node.firstChild) {
    node.removeChild(node.firstChild);
  }
  node.classList.add('kernel-sandbox-framed');
  ours.add(frame);
  node.appendChild(frame);
}

// The user's own Markdown cell: its MimeModel has no output type (display_data, execute_result...) and
// the cell marks its renderer before rendering. Everything else a panel's rendermime draws is the
// kernel's: outputs, the tooltip's and the inspector's inspect_reply bundles (MimeModels too).
function isMarkdownCell(renderer, model) {
  return typeof model.type !== 'string' && renderer.hasClass('jp-MarkdownOutput');
}

// A factory that makes the original renderer, whose renderModel draws into a frame when `framed()`.
function framingFactory(original, mimeType, framed) {
  return {
    safe: original.safe,
    mimeTypes: [mimeType],
    defaultRank: original.defaultRank,
    createRenderer(options) {
      const renderer = original.createRenderer(options);
      const render = renderer.renderModel.bind(renderer);
      renderer.renderModel = model =>
        !isMarkdownCell(renderer, model) && framed() ? renderInFrame(renderer, options.mimeType, model, options) : render(model);
      return renderer;
    }
  };
}

// Wraps, in place, every factory of `rendermime` that can run script or lay out HTML.
function frameFactories(rendermime, framed) {
  for (const mimeType of rendermime.mimeTypes) {
    if (INERT.has(mimeType)) {
      continue;
    }
    const original = rendermime.getFactory(mimeType);
    const rank = rendermime.getRank(mimeType);
    rendermime.addFactory(framingFactory(original, mimeType, framed), rank);
  }
}

function kernelspecOf(specs, name) {
  return name && specs && specs.kernelspecs ? specs.kernelspecs[name] : undefined;
}

// The name of the provisioner a kernelspec's metadata names, if any
function provisionerOf(spec) {
  const provisioner = spec.metadata && spec.metadata.kernel_provisioner;
  return provisioner && typeof provisioner === 'object' ? provisioner.provisioner_name : undefined;
}

// A kernel-sandbox provisioner in its metadata, or the launcher in its argv (a kernelspec run without provisioner)
function isSandboxedSpec(spec) {
  if (PROVISIONERS.has(provisionerOf(spec))) {
    return true;
  }
  return Array.isArray(spec.argv) && spec.argv.some(arg => typeof arg === 'string' && arg.includes('kernel_sandbox.launch'));
}

// The HTML of ipywidgets' HTML and HTMLMath views, and descriptions with description_allow_html (the
// label of every described control, a Checkbox's span: ipywidgets' inline_sanitize puts the $...$
// parts back unsanitized and keeps inline styles), go into the page (they are widget views, not
// outputs): in a sandboxed panel each change of them is neutralised before any of its handlers can
// run (a MutationObserver runs before the events, which come in later tasks).
const WIDGET_HTML = '.widget-html-content, .widget-htmlmath-content, .widget-label, .widget-label-basic';
const ACTIVE = new Set(['script', 'iframe', 'frame', 'object', 'embed', 'style', 'link', 'meta', 'base', 'form', 'portal']);
const URL_ATTRIBUTES = new Set(['href', 'xlink:href', 'src', 'action', 'formaction', 'data', 'srcdoc', 'srcset', 'poster', 'background', 'to', 'values', 'from', 'by']);

function neutralise(root) {
  for (const element of [...root.querySelectorAll('*')]) {
    if (ACTIVE.has(element.localName)) {
      element.remove();
      continue;
    }
    for (const { name, value } of [...element.attributes]) {
      const lower = name.toLowerCase();
      const bare = value.replace(/[\u0000-\u0020]/g, '');
      const url = URL_ATTRIBUTES.has(lower) && /^(javascript|vbscript):|^(https?:)?\/\//i.test(bare);
      const style = lower === 'style' && /position|url\(|expression|@import/i.test(bare);
      if (lower.startsWith('on') || lower === 'srcdoc' || url || style) {
        element.removeAttribute(name);
      }
    }
  }
}

function watchWidgetHtml(node, framed) {
  new MutationObserver(mutations => {
    if (!framed()) {
      return;
    }
    const seen = new Set();
    const check = content => {
      if (!seen.has(content)) {
        seen.add(content);
        neutralise(content);
      }
    };
    for (const mutation of mutations) {
      const target = mutation.target.nodeType === 1 ? mutation.target : mutation.target.parentElement;
      const content = target && target.closest(WIDGET_HTML);
      if (content) {
        check(content);
      }
      // a view rendered before it was attached comes in whole
      for (const added of mutation.addedNodes) {
        if (added.nodeType === 1) {
          (added.matches(WIDGET_HTML) ? [added] : added.querySelectorAll(WIDGET_HTML)).forEach(check);
        }
      }
    }
  }).observe(node, { childList: true, subtree: true, attributes: true });
}

const wrapped = new WeakSet();

function isSandboxedKernel(app, name) {
  const spec = kernelspecOf(app.serviceManager.kernelspecs.specs, name);
  return spec === undefined || isSandboxedSpec(spec);
}

function guard(app, node, rendermime, sessionContext, documentKernel) {
  if (wrapped.has(rendermime)) {
    return;
  }
  wrapped.add(rendermime);
  const framed = () => {
    const session = sessionContext.session;
    return isSandboxedKernel(app, (session && session.kernel && session.kernel.name) || documentKernel());
  };
  frameFactories(rendermime, framed);
  watchWidgetHtml(node, framed);
}

// A tooltip renders the kernel's inspect_reply with the rendermime its caller hands over: a notebook's or
// console's (wrapped above), or, for a file editor's, the application's own. For a sandboxed kernel the
// latter is swapped for a framing copy.
function guardTooltips(app, manager) {
  const invoke = manager.invoke.bind(manager);
  manager.invoke = options => {
    const { kernel, rendermime } = options;
    if (!rendermime || wrapped.has(rendermime) || !isSandboxedKernel(app, kernel && kernel.name)) {
      return invoke(options);
    }
    const framing = rendermime.clone();
    frameFactories(framing, () => true);
    wrapped.add(framing);
    return invoke({ ...options, rendermime: framing });
  };
}

function guardNotebook(app, panel) {
  guard(app, panel.node, panel.content.rendermime, panel.sessionContext, () => {
    const model = panel.context.model;
    const kernelspec = model && model.getMetadata ? model.getMetadata('kernelspec') : undefined;
    return (kernelspec && typeof kernelspec.name === 'string' && kernelspec.name) || panel.sessionContext.kernelPreference.name;
  });
}

function guardConsole(app, panel) {
  guard(app, panel.node, panel.console.rendermime, panel.sessionContext, () => panel.sessionContext.kernelPreference.name);
}

const plugin = {
  id: 'kernel-sandbox-frame:plugin',
  description: 'Renders the rich outputs of sandboxed kernels in opaque-origin sandbox iframes.',
  autoStart: true,
  requires: [INotebookWidgetFactory, INotebookTracker],
  optional: [IConsoleTracker, ITooltipManager, IThemeManager],
  activate(app, notebookFactory, notebooks, consoles, tooltips, themes) {
    handlers = usableHandlers(notebooks);
    window.addEventListener('message', onMessage);
    if (themes) {
      themes.themeChanged.connect(() => requestAnimationFrame(() => updateTheme(ourFrames())));
    }
    if (tooltips) {
      guardTooltips(app, tooltips);
    }
    // widgetCreated fires as the panel is made, before its notebook loads; the tracker is the fallback
    notebookFactory.widgetCreated.connect((_, panel) => guardNotebook(app, panel));
    notebooks.widgetAdded.connect((_, panel) => guardNotebook(app, panel));
    notebooks.forEach(panel => guardNotebook(app, panel));
    if (consoles) {
      consoles.widgetAdded.connect((_, panel) => guardConsole(app, panel));
      consoles.forEach(panel => guardConsole(app, panel));
    }
    document.body.dataset.kernelSandboxFrame = 'active';
  }
};

const RESTART_KEEPING_VARIABLES = 'kernel-sandbox:restart-keep-variables';
const KEEP_TITLE = 'Restart Kernel, Keep Variables';
// The lines of %checkpoint's report that name what it could not save ("Not saved: s (why)",
// "File not saved: path (why)"): their names go into the notification, which shows 140 characters.
const NOT_SAVED = /^(?:File )?not saved: (.+?)(?: \(.*\))?$/i;

// The backends whose kernels load %checkpoint and %restore at start (OpenSandbox kernels have the
// execution API's checkpoint() only).
const MAGIC_PROVISIONERS = new Set(['kernel-sandbox-docker']);

// The kernel of notebook `panel` when its kernelspec is known and names a sandboxed backend with the
// magics (a subset of isSandboxedSpec's), else null.
function sandboxedKernelOf(app, panel) {
  const session = panel && panel.sessionContext.session;
  const kernel = session && session.kernel;
  const spec = kernel && kernelspecOf(app.serviceManager.kernelspecs.specs, kernel.name);
  return spec && MAGIC_PROVISIONERS.has(provisionerOf(spec)) ? kernel : null;
}

// Runs a line magic as a request of its own (not a cell: nothing shows in the notebook, no history) and
// returns whether the kernel answered "ok", the stream text it printed, and its error.
async function runMagic(kernel, code) {
  const future = kernel.requestExecute({ code, silent: false, store_history: false, allow_stdin: false });
  let output = '';
  future.onIOPub = message => {
    if (message.header.msg_type === 'stream') {
      output += message.content.text;
    }
  };
  const { content } = await future.done;
  const error = content.status === 'error' ? `${content.ename}: ${content.evalue}` : `the kernel answered "${content.status}"`;
  return { ok: content.status === 'ok', output: output.trim(), error: content.status === 'ok' ? '' : error };
}

// Resolves when `kernel` reports "idle" (a restarted kernel has answered), rejects if it dies first.
function whenIdle(kernel) {
  return new Promise((resolve, reject) => {
    const check = () => {
      if (kernel.status === 'idle' || kernel.status === 'dead') {
        kernel.statusChanged.disconnect(check);
        kernel.status === 'idle' ? resolve() : reject(new Error('the new kernel died as it started'));
      }
    };
    kernel.statusChanged.connect(check);
    check();
  });
}

// A dialog with the magics' whole reports (the notification shows only their first 140 characters).
function showDetails(text) {
  const pre = document.createElement('pre');
  pre.className = 'kernel-sandbox-keep-details';
  pre.style.cssText = 'white-space:pre-wrap;max-width:70vw;max-height:60vh;overflow:auto';
  pre.textContent = text;
  return showDialog({ title: KEEP_TITLE, body: new Widget({ node: pre }), buttons: [Dialog.okButton()] });
}

// %checkpoint, then (only if it saved) a restart and %restore, reported as one notification that ends as
// success, warning (something was not saved: named) or error (what failed, and whether the kernel restarted).
async function restartKeepingVariables(app, panel) {
  // One notification at the end (meanwhile the kernel's status shows busy, then restarting, as with JupyterLab's
  // own restart): an "in-progress" one updated soon after it is emitted can keep its first text (JupyterLab 4.6).
  const context = panel.sessionContext;
  const log = [];
  const finish = (type, message) =>
    Notification.emit(message, type, {
      autoClose: type === 'success' ? 5000 : false,
      actions: [{ label: 'Details', caption: 'The reports of %checkpoint and %restore', callback: () => showDetails(log.join('\n\n')) }]
    });
  try {
    const saved = await runMagic(context.session.kernel, '%checkpoint');
    log.push(`%checkpoint: ${saved.output || '(no output)'}${saved.error ? `\n${saved.error}` : ''}`);
    if (!saved.ok) {
      return finish('error', `Kernel not restarted: %checkpoint failed (${saved.error})`);
    }
    await context.restartKernel(); // JupyterLab's own restart, without its "all variables will be lost" dialog
    const kernel = context.session && context.session.kernel;
    if (!context.isReady || !kernel) {
      return finish('error', 'The kernel did not restart; its checkpoint is kept: run %restore once it is back');
    }
    await whenIdle(kernel);
    const restored = await runMagic(kernel, '%restore');
    log.push(`%restore: ${restored.output || '(no output)'}${restored.error ? `\n${restored.error}` : ''}`);
    if (!restored.ok) {
      return finish('error', `Kernel restarted, but %restore failed (${restored.error})`);
    }
    const lost = saved.output.split('\n').map(line => NOT_SAVED.exec(line.trim())).filter(Boolean).map(match => match[1]);
    return lost.length
      ? finish('warning', `Kernel restarted, variables kept. Not saved: ${lost.join(', ')}`)
      : finish('success', 'Kernel restarted, variables kept.');
  } catch (error) {
    log.push(String((error && error.stack) || error));
    return finish('error', `Restart keeping variables failed: ${(error && error.message) || error}`);
  }
}

const restartPlugin = {
  id: 'kernel-sandbox-frame:restart-keep-variables',
  description: 'The command "Restart Kernel, Keep Variables" for notebooks on a sandboxed kernel (in the Kernel menu by its schema).',
  autoStart: true,
  requires: [INotebookTracker],
  optional: [ICommandPalette],
  activate(app, notebooks, palette) {
    const running = new WeakSet(); // the session contexts a restart keeping variables is under way in
    app.commands.addCommand(RESTART_KEEPING_VARIABLES, {
      label: KEEP_TITLE,
      caption: 'Save the variables (%checkpoint), restart the kernel, load them back (%restore)',
      // as JupyterLab's notebook commands: the current notebook, when it is the active widget
      isEnabled: () => {
        const panel = notebooks.currentWidget;
        const current = panel !== null && panel === app.shell.currentWidget;
        return current && !running.has(panel.sessionContext) && sandboxedKernelOf(app, panel) !== null;
      },
      execute: async () => {
        const panel = notebooks.currentWidget;
        if (!panel || !sandboxedKernelOf(app, panel) || running.has(panel.sessionContext)) {
          return;
        }
        running.add(panel.sessionContext);
        app.commands.notifyCommandChanged(RESTART_KEEPING_VARIABLES);
        try {
          await restartKeepingVariables(app, panel);
        } finally {
          running.delete(panel.sessionContext);
          app.commands.notifyCommandChanged(RESTART_KEEPING_VARIABLES);
        }
      }
    });
    if (palette) {
      palette.addItem({ command: RESTART_KEEPING_VARIABLES, category: 'Notebook Operations' });
    }
    // the palette and toolbars show the enabled state: refresh it when the notebook, its kernel or the specs change
    const changed = () => app.commands.notifyCommandChanged(RESTART_KEEPING_VARIABLES);
    const watch = panel => panel.sessionContext.kernelChanged.connect(changed);
    notebooks.widgetAdded.connect((_, panel) => watch(panel));
    notebooks.forEach(watch);
    notebooks.currentChanged.connect(changed);
    app.serviceManager.kernelspecs.specsChanged.connect(changed);
  }
};

export default [plugin, restartPlugin];
