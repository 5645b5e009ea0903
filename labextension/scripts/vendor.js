// Writes src/NAME-source.js for each renderer the frames run inline (their CSP loads nothing from anywhere):
// its browser builds as one string of script, loaded by a dynamic import only into frames that need it.
const fs = require('fs');
const path = require('path');

const RENDERERS = {
  vega: ['vega/build/vega.min.js', 'vega-lite/build/vega-lite.min.js', 'vega-embed/build/vega-embed.min.js'],
  plotly: ['plotly.js-dist-min/plotly.min.js']
};

const notices = [];
for (const [name, builds] of Object.entries(RENDERERS)) {
  const source = builds
    .map(build => fs.readFileSync(path.join(__dirname, '..', 'node_modules', build), 'utf8').replace(/\n\/\/# sourceMappingURL=.*\s*$/, '\n'))
    .join(';\n')
    .replace(/<\/(script)/gi, '<\\/$1');
  fs.writeFileSync(path.join(__dirname, '..', 'src', `${name}-source.js`), `export default ${JSON.stringify(source)};\n`);
  // their licences (BSD-3-Clause, MIT) go with the built extension, which carries their code as a string
  for (const build of builds) {
    const dir = path.join(__dirname, '..', 'node_modules', build.split('/')[0]);
    const { name: pkg, version, license, repository } = JSON.parse(fs.readFileSync(path.join(dir, 'package.json'), 'utf8'));
    const file = path.join(dir, 'LICENSE');
    const text = fs.existsSync(file) ? fs.readFileSync(file, 'utf8') : `${license}: ${repository.url || repository}`;
    notices.push(`${pkg} ${version}\n\n${text}`);
  }
}
fs.writeFileSync(path.join(__dirname, '..', 'src', 'renderer-licenses.txt'), notices.join('\n\n'));
