// Ctrl+F with "Search Cell Outputs" finds text inside output frames. JupyterLab searches an output by walking the
// text nodes of its node, skipping iframes; so the frame reports its text (TEXT_MESSAGE, on load and on every
// change) and the page keeps it, as text only, in a visually hidden copy at the top of the output's node: the
// notebook's search counts, highlights and scrolls to the matches there (the output in view), and
// "Copy Output to Clipboard" copies it.
//
// A frame can report any text of its choice, as it can show any: it lands in textContent (never parsed as
// HTML), is cut at MAX_TEXT characters, is hidden and out of the accessibility tree (the frame is read itself).
export const TEXT_MESSAGE = 'kernel-sandbox-frame:text';
export const MAX_TEXT = 100000;
const TEXT_CLASS = 'kernel-sandbox-frame-text';

// Runs in the frame: its text as rendered, reported after each burst of changes.
export const SEARCH_FRAME_SCRIPT = `(function () {
  var pending = false, last = null;
  function report() {
    pending = false;
    var text = document.body ? document.body.innerText.slice(0, ${MAX_TEXT}) : '';
    if (text !== last) {
      last = text;
      parent.postMessage({ type: ${JSON.stringify(TEXT_MESSAGE)}, text: text }, '*');
    }
  }
  function later() { if (!pending) { pending = true; setTimeout(report, 100); } }
  new MutationObserver(later).observe(document.documentElement, { childList: true, subtree: true, characterData: true });
  window.addEventListener('load', later);
})();`;

/** Acts on a TEXT_MESSAGE `data` from `frame`: the frame's text, kept searchable next to it. Returns whether it did. */
export function keepText(frame, data) {
  const node = frame.parentElement;
  if (typeof data.text !== 'string' || !node) {
    return false;
  }
  let copy = node.querySelector(`:scope > .${TEXT_CLASS}`);
  if (!copy) {
    copy = document.createElement('div');
    copy.className = TEXT_CLASS;
    copy.setAttribute('aria-hidden', 'true');
    // the usual visually-hidden box: no size, clipped, but laid out where the output starts
    copy.style.cssText =
      'position:absolute;width:1px;height:1px;margin:-1px;padding:0;border:0;overflow:hidden;clip-path:inset(50%);white-space:pre-wrap';
    node.insertBefore(copy, frame);
  }
  copy.textContent = data.text.slice(0, MAX_TEXT);
  return true;
}
