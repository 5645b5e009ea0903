// validPng: the page keeps a PNG a frame posts only when it is one, within bounds. The frame's script
// is the attacker's (a chart's spec or a widget can run script there): every other string is refused.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { MAX_PNG_BYTES, validPng } from '../src/png.js';

const PREFIX = 'data:image/png;base64,';

// A PNG's signature and IHDR chunk for width x height, padded to `size` bytes.
function png(width, height, size = 64) {
  const bytes = Buffer.alloc(size);
  Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]).copy(bytes, 0);
  bytes.writeUInt32BE(13, 8);
  bytes.write('IHDR', 12, 'latin1');
  bytes.writeUInt32BE(width, 16);
  bytes.writeUInt32BE(height, 20);
  return bytes;
}

const url = bytes => PREFIX + bytes.toString('base64');

test('a real PNG within the bounds is kept, as its base64', () => {
  const bytes = png(640, 480);
  assert.equal(validPng(url(bytes)), bytes.toString('base64'));
  assert.equal(validPng(url(png(8192, 1))), png(8192, 1).toString('base64'));
});

test('anything but a PNG data URL is refused', () => {
  const base64 = png(10, 10).toString('base64');
  for (const value of [
    null, undefined, 42, {}, ['x'], '',
    `data:image/svg+xml;base64,${base64}`,       // script-capable image types
    `data:text/html;base64,${base64}`,
    `DATA:image/png;base64,${base64}`,            // only the exact prefix
    `javascript:alert(1)//${PREFIX}${base64}`,
    `${PREFIX}%%%not-base64%%%`,
    PREFIX
  ]) {
    assert.equal(validPng(value), null, String(value).slice(0, 60));
  }
});

test('a forged header is refused: signature, IHDR, sides', () => {
  const signature = png(10, 10);
  signature[1] = 0x51;
  assert.equal(validPng(url(signature)), null);
  const chunk = png(10, 10);
  chunk.write('IDAT', 12, 'latin1');
  assert.equal(validPng(url(chunk)), null);
  const length = png(10, 10);
  length.writeUInt32BE(14, 8);
  assert.equal(validPng(url(length)), null);
  for (const [width, height] of [[0, 10], [10, 0], [8193, 10], [10, 8193], [0xffffffff, 1]]) {
    assert.equal(validPng(url(png(width, height))), null, `${width}x${height}`);
  }
  assert.equal(validPng(url(png(10, 10, 32))), null, 'shorter than a header');
});

test('more than MAX_PNG_BYTES is refused before it is decoded', () => {
  assert.equal(validPng(url(png(10, 10, MAX_PNG_BYTES))), png(10, 10, MAX_PNG_BYTES).toString('base64'));
  assert.equal(validPng(url(png(10, 10, MAX_PNG_BYTES + 1))), null);
  assert.equal(validPng(PREFIX + 'A'.repeat(Math.ceil((MAX_PNG_BYTES * 4) / 3) + 64)), null);
});
