// Plotly figures (application/vnd.plotly.v1+json, what plotly's JupyterLab renderer draws) inside an output frame:
// plotly.js runs in the frame, loaded (its 4.8 MB) only for frames that show a figure; nothing is fetched (no
// topojson, no MathJax, no Chart Studio link: the frame's CSP would refuse them anyway). Once drawn, its PNG goes
// to the page (png.js).
import { PNG_FRAME_POST } from './png';

export const PLOTLY_MIME = 'application/vnd.plotly.v1+json';

let plotlySource = null;

function escapeScript(source) {
  return source.replace(/<\/(script)/gi, '<\\/$1');
}

/** The body of a frame that draws the Plotly figure `figure` ({data, layout, config?}, as the kernel sent it). */
export async function plotlyBody(figure) {
  if (plotlySource === null) {
    plotlySource = (await import('./plotly-source.js')).default;
  }
  const draw = `(function () {
  var figure = ${escapeScript(JSON.stringify(figure))} || {};
  var config = { displaylogo: false, showLink: false, showSendToCloud: false, showEditInChartStudio: false,
                 responsive: true, topojsonURL: 'data:,', typesetMath: false };
  Plotly.newPlot(document.getElementById('plot'), figure.data || [], figure.layout || {}, config)
    .then(function (plot) { (${PNG_FRAME_POST})(Plotly.toImage(plot, { format: 'png' })); })
    .catch(function (error) { document.getElementById('plot').textContent = String(error && error.message || error); });
})();`;
  return `<div id="plot"></div><script>${plotlySource}</script><script>${draw}</script>`;
}
