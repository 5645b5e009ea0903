// ESLint's recommended rules on the extension's sources (browser modules), its build scripts
// (Node, CommonJS) and its unit tests (Node modules): `npm run lint`.
const js = require('@eslint/js');
const globals = require('globals');

module.exports = [
  { ignores: ['node_modules/', 'build-frame/', 'src/*-source.js'] },
  js.configs.recommended,
  // frame.js says `eslint-disable no-var` for the readers of its frame-side script: kept
  { linterOptions: { reportUnusedDisableDirectives: 'off' } },
  {
    files: ['src/**/*.js', 'frame/**/*.js'],
    languageOptions: { sourceType: 'module', globals: { ...globals.browser } },
    // `catch (error) { return; }`: a failed call is dropped on purpose, its error unread
    rules: { 'no-unused-vars': ['error', { caughtErrors: 'none' }] }
  },
  {
    // the frame's own script strips terminal escapes (ESC, BEL) from text it shows
    files: ['src/frame.js'],
    rules: { 'no-control-regex': 'off' }
  },
  {
    files: ['scripts/**/*.js', 'eslint.config.js'],
    languageOptions: { sourceType: 'commonjs', globals: { ...globals.node } }
  },
  {
    files: ['test/**/*.mjs'],
    languageOptions: { sourceType: 'module', globals: { ...globals.node } }
  }
];
