// Writes src/widgets-source.js and src/mathjax-source.js: the scripts the page sends, as text, to the output frames
// that need them (an ipywidgets manager for the standard controls, built from frame/widgets.js; MathJax's
// tex-svg, which draws without loading fonts). Only the frames showing a widget or math load them.
const fs = require('fs');
const path = require('path');
const webpack = require('webpack');

const root = path.join(__dirname, '..');
const out = path.join(root, 'build-frame');

function write(name, source) {
  fs.writeFileSync(path.join(root, 'src', name), `export default ${JSON.stringify(source)};\n`);
}

const config = {
  mode: 'production',
  entry: path.join(root, 'frame', 'widgets.js'),
  output: { path: out, filename: 'widgets.js' },
  devtool: false,
  performance: { hints: false },
  // a second copy of the controls for ipywidgets 7 is not wanted: such widgets fail to load in a frame
  resolve: { alias: { '@jupyter-widgets/base7': false, '@jupyter-widgets/controls7': false } },
  module: {
    rules: [
      { test: /\.css$/, use: ['style-loader', 'css-loader'] },
      { test: /\.(woff2?|ttf|eot|svg|png|gif)$/, type: 'asset/inline' }
    ]
  },
  optimization: { splitChunks: false }
};

webpack(config, (error, stats) => {
  if (error || stats.hasErrors()) {
    console.error(error || stats.toString({ all: false, errors: true }));
    process.exit(1);
  }
  write('widgets-source.js', fs.readFileSync(path.join(out, 'widgets.js'), 'utf8'));
  const mathjax = fs.readFileSync(path.join(root, 'node_modules', 'mathjax', 'es5', 'tex-svg.js'), 'utf8');
  write('mathjax-source.js', mathjax.replace(/\n\/\/# sourceMappingURL=.*\s*$/, '\n'));
  const notices = ['@jupyter-widgets/html-manager', '@jupyter-widgets/controls', '@jupyter-widgets/base', 'mathjax'].map(name => {
    const dir = path.join(root, 'node_modules', name);
    const { version, license } = JSON.parse(fs.readFileSync(path.join(dir, 'package.json'), 'utf8'));
    const file = ['LICENSE', 'LICENSE.txt', 'LICENSE.md'].map(f => path.join(dir, f)).find(f => fs.existsSync(f));
    return `${name} ${version}\n\n${file ? fs.readFileSync(file, 'utf8') : license}`;
  });
  fs.writeFileSync(path.join(root, 'src', 'frame-licenses.txt'), notices.join('\n\n'));
  console.log(`frame scripts: widgets ${stats.toJson({ assets: true }).assets[0].size} bytes, mathjax ${mathjax.length} bytes`);
});
