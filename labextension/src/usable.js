// What makes a framed output as usable as a local kernel's: theme.js (JupyterLab's look), search.js (Ctrl+F),
// focus.js (shortcuts after a click in a frame), contextmenu.js (the output menu), png.js (charts saved as PNGs).
// One entry for the frame's owner: the frame document's head and body attributes, and the page's handler of each
// message a frame posts.
import { CONTEXTMENU_FRAME_SCRIPT, CONTEXTMENU_MESSAGE, openContextMenu } from './contextmenu';
import { KEYS_FRAME_SCRIPT, KEY_MESSAGE, forwardKey } from './focus';
import { PNG_MESSAGE, keepPng } from './png';
import { SEARCH_FRAME_SCRIPT, TEXT_MESSAGE, keepText } from './search';
import { themeHead, themeLightAttribute, updateTheme } from './theme';

export { themeLightAttribute, updateTheme };

/** The part of a frame document's <head> these modules need (styles and scripts; the frame's CSP must allow inline ones). */
export function usableHead() {
  return `${themeHead()}<script>${SEARCH_FRAME_SCRIPT}\n${KEYS_FRAME_SCRIPT}\n${CONTEXTMENU_FRAME_SCRIPT}</script>`;
}

/**
 * The page's handlers of the frames' messages, by type: each takes the frame element (already known as one of
 * ours, its message of opaque origin) and the message's data, checks the data itself, and acts or ignores it.
 * `notebooks` is the INotebookTracker.
 */
export function usableHandlers(notebooks) {
  return {
    [TEXT_MESSAGE]: keepText,
    [KEY_MESSAGE]: (frame, data) => forwardKey(notebooks, frame, data),
    [CONTEXTMENU_MESSAGE]: (frame, data) => openContextMenu(notebooks, frame, data),
    [PNG_MESSAGE]: (frame, data) => keepPng(notebooks, frame, data)
  };
}
