// JupyterLab's shortcuts after a click in an output frame: the keys go to the frame's document, which the
// page's command registry never sees. The frame forwards the keydown of a JupyterLab shortcut (and only of
// those: the frame's own inputs keep every other key) as KEY_MESSAGE; the page returns focus to the frame's
// cell, in command mode, and replays the shortcut there, so Ctrl/Cmd+S saves, Shift+Enter runs the cell...
//
// A frame's script can post anything: the page acts on a key only while that frame holds the focus and the
// user has just pressed a key or clicked (the browser's transient user activation, which a frame cannot make
// by itself), and only on a shortcut of SHORTCUTS, replayed from the page's own table (of the message only
// the key and its modifiers are read).
export const KEY_MESSAGE = 'kernel-sandbox-frame:key';

// name -> [key, code, keyCode, shift, alt, accel]; accel is Ctrl, or Cmd on a Mac
const SHORTCUTS = {
  Escape: ['Escape', 'Escape', 27, false, false, false],
  'Shift Enter': ['Enter', 'Enter', 13, true, false, false],
  'Accel Enter': ['Enter', 'Enter', 13, false, false, true],
  'Alt Enter': ['Enter', 'Enter', 13, false, true, false],
  'Accel S': ['s', 'KeyS', 83, false, false, true],
  'Accel B': ['b', 'KeyB', 66, false, false, true]
};
const IS_MAC = /Mac|iPhone|iPad/.test(navigator.platform);

// The name of the shortcut a keydown (or a message with its fields) is, as SHORTCUTS names them, or ''.
function shortcutName(mac, event) {
  if (typeof event.key !== 'string' || (mac ? event.ctrlKey : event.metaKey) === true) {
    return '';
  }
  var parts = [];
  if ((mac ? event.metaKey : event.ctrlKey) === true) { parts.push('Accel'); }
  if (event.altKey === true) { parts.push('Alt'); }
  if (event.shiftKey === true) { parts.push('Shift'); }
  parts.push(event.key.length === 1 ? event.key.toUpperCase() : event.key);
  return parts.join(' ');
}

// Runs in the frame: a keydown of a shortcut is forwarded (as bridge.md's `key`) instead of handled there.
export const KEYS_FRAME_SCRIPT = `(function () {
  var shortcutName = ${shortcutName.toString()};
  var known = ${JSON.stringify(Object.keys(SHORTCUTS))};
  document.addEventListener('keydown', function (event) {
    if (known.indexOf(shortcutName(${IS_MAC}, event)) < 0) { return; }
    event.preventDefault();
    event.stopPropagation();
    parent.postMessage({ type: ${JSON.stringify(KEY_MESSAGE)}, key: event.key, code: event.code, shiftKey: event.shiftKey,
      ctrlKey: event.ctrlKey, altKey: event.altKey, metaKey: event.metaKey }, '*');
  }, true);
})();`;

/** Whether the user is acting in `frame` now: it holds the page's focus and the page has transient user activation. */
export function userIsIn(frame) {
  const activation = navigator.userActivation;
  return document.hasFocus() && document.activeElement === frame && (!activation || activation.isActive);
}

/**
 * Makes the cell holding `node` the active cell of its notebook (of `notebooks`, an INotebookTracker), in command
 * mode, as a click on it does; returns the notebook widget, or null when `node` is in none.
 */
export function activateCellOf(notebooks, node) {
  let found = null;
  notebooks.forEach(panel => {
    const notebook = panel.content;
    const index = found === null && notebook.node.contains(node) ? notebook.widgets.findIndex(cell => cell.node.contains(node)) : -1;
    if (index >= 0) {
      notebook.activeCellIndex = index;
      notebook.mode = 'command';
      found = notebook;
    }
  });
  return found;
}

/**
 * Acts on a KEY_MESSAGE `data` from `frame`: focus back to the frame's cell (command mode) and the shortcut replayed
 * there through JupyterLab's keydown handling. Returns whether it did.
 */
export function forwardKey(notebooks, frame, data) {
  const name = shortcutName(IS_MAC, data);
  const shortcut = Object.prototype.hasOwnProperty.call(SHORTCUTS, name) ? SHORTCUTS[name] : null;
  // Escape only gives the focus back; it does not activate the page, so it needs the focus alone
  if (!shortcut || !(name === 'Escape' ? document.activeElement === frame : userIsIn(frame))) {
    return false;
  }
  const [key, code, keyCode, shiftKey, altKey, accel] = shortcut;
  const notebook = activateCellOf(notebooks, frame);
  const target = notebook ? notebook.node : document.body;
  if (notebook) {
    notebook.node.focus();
  } else {
    frame.blur();
  }
  if (name !== 'Escape') {
    const init = { key, code, keyCode, which: keyCode, shiftKey, altKey, bubbles: true, cancelable: true };
    target.dispatchEvent(new KeyboardEvent('keydown', { ...init, ctrlKey: accel && !IS_MAC, metaKey: accel && IS_MAC }));
  }
  return true;
}
