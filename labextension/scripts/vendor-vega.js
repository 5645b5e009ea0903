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

// Their licences (BSD-3-Clause) go with the built extension, which carries their code as a string.
const notices = builds.map(name => {
  const dir = path.join(__dirname, '..', 'node_modules', name.split('/')[0]);
  const { name: pkg, version, license, repository } = JSON.parse(fs.readFileSync(path.join(dir, 'package.json'), 'utf8'));
  const file = path.join(dir, 'LICENSE');
  const text = fs.existsSync(file) ? fs.readFileSync(file, 'utf8') : `${license}: ${repository.url || repository}`;
  return `${pkg} ${version}\n\n${text}`;
});
fs.writeFileSync(path.join(__dirname, '..', 'src', 'vega-licenses.txt'), notices.join('\n\n'));
