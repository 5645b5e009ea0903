// JupyterLab's output context menu (Clear Outputs, Enable Scrolling for Outputs, Copy Output...) on a right-click
// in an output frame: the frame forwards the click's position and the index of the output clicked as
// CONTEXTMENU_MESSAGE (Shift+right-click keeps the browser's own menu, as in the page) and the page opens its own
// menu there, as for a click on that output's node in the area (search.js outputNode).
//
// The page acts only while the user is in that frame (focus.js userIsIn: a frame cannot open the menu by
// itself), and puts the menu inside the frame's box whatever position the message claims.
import { activateCellOf, userIsIn } from './focus';
import { outputNode } from './search';

export const CONTEXTMENU_MESSAGE = 'kernel-sandbox-frame:contextmenu';

// Runs in the frame.
export const CONTEXTMENU_FRAME_SCRIPT = `(function () {
  document.addEventListener('contextmenu', function (event) {
    if (event.shiftKey) { return; }
    event.preventDefault();
    var root = document.getElementById('outputs');
    var node = event.target instanceof Element ? event.target : null;
    while (node && node.parentElement !== root) { node = node.parentElement; }
    var index = node ? Array.prototype.indexOf.call(root.children, node) : 0;
    parent.postMessage({ type: ${JSON.stringify(CONTEXTMENU_MESSAGE)}, x: event.clientX, y: event.clientY, index: index }, '*');
  }, true);
})();`;

function clamp(value, low, high) {
  return Math.min(Math.max(typeof value === 'number' && Number.isFinite(value) ? value : 0, low), high);
}

/**
 * Acts on a CONTEXTMENU_MESSAGE `data` from `frame`: its cell made active (the menu's items act on it) and JupyterLab's
 * context menu for the frame's output opened at the click. `notebooks` is the INotebookTracker. Returns whether it did.
 */
export function openContextMenu(notebooks, frame, data) {
  if (!userIsIn(frame)) {
    return false;
  }
  activateCellOf(notebooks, frame);
  const box = frame.getBoundingClientRect();
  const clientX = box.left + clamp(data.x, 0, box.width);
  const clientY = box.top + clamp(data.y, 0, box.height);
  // JupyterLab opens its menu on the contextmenu event reaching the document, with the items whose selectors match the target
  const target = outputNode(frame, data.index) || frame;
  target.dispatchEvent(new MouseEvent('contextmenu', { bubbles: true, cancelable: true, button: 2, buttons: 2, clientX, clientY }));
  return true;
}
