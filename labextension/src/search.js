// Ctrl+F with "Search Cell Outputs" finds text inside output frames. JupyterLab searches each output of a cell
// (each child widget of its output area) by walking the text nodes of its node, skipping iframes; so the frame
// reports the text of each output it draws (TEXT_MESSAGE with the output's index, on load, on every change and on
// every new list of outputs) and the page keeps it, as text only, in a visually hidden copy at the top of that
// output's child node in the area (of the frame's parent node when it is no output area: the tooltip's): the
// notebook's search counts, highlights and scrolls to the matches there, and "Copy Output to Clipboard" copies it.
//
// A frame can report any text of its choice, as it can show any: it lands in textContent (never parsed as
// HTML), is cut at MAX_TEXT characters, is hidden and out of the accessibility tree (the frame is read itself).
export const TEXT_MESSAGE = 'kernel-sandbox-frame:text';
export const MAX_TEXT = 100000;
const TEXT_CLASS = 'kernel-sandbox-frame-text';
// The page's message carrying the frame's outputs (index.js)
const OUTPUTS_MESSAGE = 'kernel-sandbox-frame:outputs';

// Runs in the frame: the text of each output (#outputs' children) as rendered, reported after each burst of
// changes, and all of them again when the page sends the outputs (it may have made the output nodes anew).
export const SEARCH_FRAME_SCRIPT = `(function () {
  var pending = false, last = [];
  function report() {
    pending = false;
    var root = document.getElementById('outputs');
    var nodes = root ? root.children : [];
    for (var i = 0; i < nodes.length; i++) {
      var text = nodes[i].innerText.slice(0, ${MAX_TEXT});
      if (text !== last[i]) {
        last[i] = text;
        parent.postMessage({ type: ${JSON.stringify(TEXT_MESSAGE)}, index: i, text: text }, '*');
      }
    }
    last.length = nodes.length;
  }
  function later() { if (!pending) { pending = true; setTimeout(report, 100); } }
  new MutationObserver(later).observe(document.documentElement, { childList: true, subtree: true, characterData: true });
  window.addEventListener('load', later);
  window.addEventListener('message', function (event) {
    if (event.source === parent && event.data && event.data.type === ${JSON.stringify(OUTPUTS_MESSAGE)}) {
      last = [];
      later();
    }
  });
})();`;

/**
 * The node of the output at `index` that `frame` draws: the index-th child of its output area (the frame's parent
 * node), or the frame's parent node itself when that is no output area. Null when there is none.
 */
export function outputNode(frame, index) {
  const node = frame.parentElement;
  if (!node || !node.classList.contains('jp-OutputArea')) {
    return node;
  }
  const children = node.querySelectorAll(':scope > .jp-OutputArea-child');
  return Number.isInteger(index) && index >= 0 && index < children.length ? children[index] : null;
}

/** Acts on a TEXT_MESSAGE `data` from `frame`: the text of one of its outputs, kept searchable in that output's node. Returns whether it did. */
export function keepText(frame, data) {
  const node = outputNode(frame, data.index === undefined ? 0 : data.index);
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
    node.insertBefore(copy, node.firstChild);
  }
  copy.textContent = data.text.slice(0, MAX_TEXT);
  return true;
}
