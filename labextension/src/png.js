// A chart also saved as a PNG: the frame showing a Vega or Plotly chart draws it as a PNG once rendered (PNG_MESSAGE,
// with the output's index in its area: frame.js) and the page adds it as image/png to that output's data in the
// notebook, so nbconvert exports, print and GitHub previews show the chart where they would show a placeholder.
//
// The PNG comes from a frame, whose script can post anything: the page stores it only for an output whose data
// holds a Vega or Plotly chart and no image/png yet, and only a real PNG (signature and IHDR header) of at most
// MAX_PNG_BYTES and MAX_SIDE pixels a side, stored as base64 as nbformat keeps images. It is an image, shown as one:
// the kernel could have sent the same image/png itself.
export const PNG_MESSAGE = 'kernel-sandbox-frame:png';
export const MAX_PNG_BYTES = 4 * 1024 * 1024;
const MAX_SIDE = 8192;
const PREFIX = 'data:image/png;base64,';
const CHART = /^application\/vnd\.(vega(lite)?\.v\d+|plotly\.v1)\+json$/;
const SIGNATURE = [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a];

/** The base64 of `url` when it is a data URL of a valid PNG within the bounds, else null. */
export function validPng(url) {
  if (typeof url !== 'string' || !url.startsWith(PREFIX) || url.length > PREFIX.length + Math.ceil((MAX_PNG_BYTES * 4) / 3) + 4) {
    return null;
  }
  const base64 = url.slice(PREFIX.length);
  let bytes;
  try {
    bytes = atob(base64);
  } catch {
    return null;
  }
  const at = i => bytes.charCodeAt(i);
  const word = i => ((at(i) << 24) | (at(i + 1) << 16) | (at(i + 2) << 8) | at(i + 3)) >>> 0;
  if (bytes.length < 33 || bytes.length > MAX_PNG_BYTES || SIGNATURE.some((b, i) => at(i) !== b)) {
    return null;
  }
  const width = word(16);
  const height = word(20);
  if (word(8) !== 13 || bytes.slice(12, 16) !== 'IHDR' || !(width > 0 && width <= MAX_SIDE && height > 0 && height <= MAX_SIDE)) {
    return null;
  }
  return base64;
}

// The output models given a PNG: each gets one, whatever its re-renderings post.
const given = new WeakSet();

// The output model at `index` of the notebook output area (of `notebooks`) whose frame is `frame`, or null.
function outputOf(notebooks, frame, index) {
  let found = null;
  notebooks.forEach(panel => {
    for (const cell of panel.content.widgets) {
      const area = cell.outputArea;
      if (found === null && area && area.node === frame.parentElement && Number.isInteger(index) && index >= 0 && index < area.model.length) {
        found = area.model.get(index);
      }
    }
  });
  return found;
}

/** Acts on a PNG_MESSAGE `data` from `frame`: its PNG added to the data of the chart output it names. Returns whether it did. */
export function keepPng(notebooks, frame, data) {
  const output = outputOf(notebooks, frame, data.index);
  const mimeTypes = output ? Object.keys(output.data) : [];
  if (!output || given.has(output) || mimeTypes.includes('image/png') || !mimeTypes.some(mime => CHART.test(mime))) {
    return false;
  }
  const png = validPng(data.png);
  if (png === null) {
    return false;
  }
  given.add(output);
  output.setData({ data: { ...output.data, 'image/png': png }, metadata: output.metadata });
  return true;
}
