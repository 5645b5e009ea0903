// Writes src/vega-source.js: vega, vega-lite and vega-embed's browser builds as one string of script,
// which the frame of a chart runs inline (its CSP loads nothing from anywhere).
const fs = require('fs');
const path = require('path');

const builds = ['vega/build/vega.min.js', 'vega-lite/build/vega-lite.min.js', 'vega-embed/build/vega-embed.min.js'];
const source = builds
  .map(name => fs.readFileSync(path.join(__dirname, '..', 'node_modules', name), 'utf8').replace(/\n\/\/# sourceMappingURL=.*\s*$/, '\n'))
  .join(';\n')
  .replace(/<\/(script)/gi, '<\\/$1');
fs.writeFileSync(path.join(__dirname, '..', 'src', 'vega-source.js'), `export default ${JSON.stringify(source)};\n`);
