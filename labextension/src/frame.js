// The output frame's own script: it runs inside <iframe sandbox="allow-scripts"> (an opaque origin), never in the
// page. `frameMain` is turned into text (Function.prototype.toString) and inlined into each frame's document, so it
// must not use anything outside its own body. It draws the outputs the page sends (nbformat JSON), asks the page
// for the heavy renderers it needs (widgets, Vega, Plotly, MathJax) and speaks the bridge of bridge.md. A chart,
// once drawn, is posted to the page as a PNG of itself (png.js keeps it in the notebook).

/* eslint-disable no-var */
export function frameMain(prefix) {
  // focus() works only while the user acts in this frame (its own user activation, which the page's keystrokes
  // do not give): a widget or output cannot take the focus from the page (the page also takes back what it gets)
  [self.HTMLElement, self.SVGElement].forEach(function (type) {
    var focus = type.prototype.focus;
    type.prototype.focus = function () {
      if (navigator.userActivation.isActive) focus.apply(this, arguments);
    };
  });
  var root = document.getElementById('outputs');
  var slots = []; // {json, node} per output, in order
  var loaded = {}; // name -> Promise of the renderer's script having run
  var waiting = {}; // name -> resolve
  var manager = null; // the ipywidgets manager, once `widgets` is loaded
  var managerReady = null;
  var comms = {}; // comm_id -> Comm of the manager
  // The kernel's widget messages are dropped until the answer to this frame's request_states (they are older than
  // the states it carries), held while the manager makes the models, then applied as they come
  var phase = 'waiting';
  var held = [];
  var pendingInfo = {};
  var requests = 0;
  var sent = {}; // local message id -> callbacks

  function post(type, fields, transfer) {
    var message = fields || {};
    message.type = prefix + type;
    parent.postMessage(message, '*', transfer || []);
  }

  function need(name) {
    if (!loaded[name]) {
      loaded[name] = new Promise(function (resolve) {
        waiting[name] = resolve;
      });
      post('need', { name: name });
    }
    return loaded[name];
  }

  function run(source) {
    var script = document.createElement('script');
    script.textContent = source;
    document.head.appendChild(script);
    script.remove();
  }

  function text(value) {
    return Array.isArray(value) ? value.join('') : typeof value === 'string' ? value : JSON.stringify(value, null, 2);
  }

  function escape(value) {
    return value.replace(/[&<>"']/g, function (c) {
      return '&#' + c.charCodeAt(0) + ';';
    });
  }

  var COLOURS = ['black', 'red', 'green', 'olive', 'blue', 'purple', 'teal', 'gray'];
  // Text with ANSI colour codes (tracebacks, coloured prints) as HTML; every other escape is dropped
  function ansi(value) {
    var out = '';
    var open = false;
    var parts = value.split(/\x1b\[([0-9;]*)m/);
    for (var i = 0; i < parts.length; i++) {
      if (i % 2 === 0) {
        out += escape(parts[i].replace(/\x1b(\[[0-9;?]*[A-Za-z]|\][^\x07]*\x07|.)/g, ''));
        continue;
      }
      if (open) {
        out += '</span>';
        open = false;
      }
      var style = '';
      parts[i].split(';').forEach(function (code) {
        var n = Number(code);
        if (n === 1) style += 'font-weight:bold;';
        else if (n >= 30 && n <= 37) style += 'color:' + COLOURS[n - 30] + ';';
        else if (n >= 90 && n <= 97) style += 'color:' + COLOURS[n - 90] + ';';
        else if (n >= 40 && n <= 47) style += 'background:' + COLOURS[n - 40] + ';';
      });
      if (style) {
        out += '<span style="' + style + '">';
        open = true;
      }
    }
    return open ? out + '</span>' : out;
  }

  // HTML as JupyterLab draws trusted HTML: its scripts run (here, inside the frame)
  function html(node, source) {
    node.innerHTML = source;
    node.querySelectorAll('script').forEach(function (old) {
      var script = document.createElement('script');
      for (var k = 0; k < old.attributes.length; k++) {
        script.setAttribute(old.attributes[k].name, old.attributes[k].value);
      }
      script.textContent = old.textContent;
      old.replaceWith(script);
    });
  }

  function typeset(node) {
    if (!/\$|\\\(|\\\[|\\begin/.test(node.textContent)) {
      return;
    }
    need('mathjax').then(function () {
      var math = self.MathJax;
      if (math && math.typesetPromise) {
        math.startup.promise.then(function () {
          return math.typesetPromise([node]);
        });
      }
    });
  }

  var IMAGES = ['image/png', 'image/jpeg', 'image/gif', 'image/webp', 'image/bmp'];
  var VEGA = /^application\/vnd\.vega(lite)?\.v\d+\+json$/;
  var PLOTLY = 'application/vnd.plotly.v1+json';

  function preferred(data) {
    var types = Object.keys(data);
    var order = ['application/vnd.jupyter.widget-view+json'];
    types.forEach(function (t) {
      if (VEGA.test(t)) order.push(t);
    });
    order.push(PLOTLY);
    order = order.concat(['application/javascript', 'text/javascript', 'text/html', 'image/svg+xml', 'text/markdown', 'text/latex'], IMAGES, [
      'application/json',
      'text/plain'
    ]);
    for (var i = 0; i < order.length; i++) {
      if (data[order[i]] !== undefined) return order[i];
    }
    return types[0];
  }

  // The PNG a chart at `index` made of itself (a promise of its data URL), for the page to save with the output
  function postPng(index, png) {
    Promise.resolve(png)
      .then(function (url) {
        post('png', { index: index, png: url });
      })
      .catch(function () {});
  }

  function vega(node, mimeType, spec, index) {
    node.textContent = '';
    var chart = document.createElement('div');
    node.appendChild(chart);
    need('vega').then(function () {
      if (spec && typeof spec === 'object') {
        spec = JSON.parse(JSON.stringify(spec));
        delete spec.usermeta;
      }
      var refuse = function () {
        return Promise.reject(new Error('kernel-sandbox: a chart from a sandboxed kernel loads nothing'));
      };
      var loader = self.vega.loader();
      loader.load = refuse;
      loader.sanitize = refuse;
      loader.http = refuse;
      loader.file = refuse;
      var mode = mimeType.indexOf('vegalite') >= 0 ? 'vega-lite' : 'vega';
      self
        .vegaEmbed(chart, spec, { mode: mode, actions: false, loader: loader })
        .then(function (result) {
          postPng(index, result.view.toImageURL('png'));
        })
        .catch(function (error) {
          chart.textContent = String((error && error.message) || error);
        });
    });
  }

  // A Plotly figure ({data, layout}, as plotly's renderer takes it) with a config that links and fetches nothing
  // (no Chart Studio link, no topojson, no MathJax: the CSP would refuse the loads anyway)
  function plotly(node, figure, index) {
    node.textContent = '';
    var plot = document.createElement('div');
    node.appendChild(plot);
    figure = figure && typeof figure === 'object' ? figure : {};
    need('plotly').then(function () {
      var config = {
        displaylogo: false,
        showLink: false,
        showSendToCloud: false,
        showEditInChartStudio: false,
        responsive: true,
        topojsonURL: 'data:,',
        typesetMath: false
      };
      self.Plotly.newPlot(plot, figure.data || [], figure.layout || {}, config)
        .then(function (drawn) {
          postPng(index, self.Plotly.toImage(drawn, { format: 'png' }));
        })
        .catch(function (error) {
          plot.textContent = String((error && error.message) || error);
        });
    });
  }

  function widget(node, view) {
    node.classList.add('jupyter-widgets');
    var id = view && view.model_id;
    if (typeof id !== 'string') return;
    widgets().then(function (m) {
      return m.loading.then(function () {
        return modelFor(m, id);
      }).then(function (model) {
        return m.create_view(model).then(function (v) {
          return m.display_view(v, node);
        });
      });
    }).catch(function (error) {
      node.textContent = 'Widget not shown: ' + ((error && error.message) || error);
    });
  }

  function modelFor(m, id) {
    if (m.has_model(id)) return m.get_model(id);
    // a widget the kernel opens after the frame asked for the others' states
    return new Promise(function (resolve, reject) {
      var tries = 0;
      var timer = setInterval(function () {
        if (m.has_model(id)) {
          clearInterval(timer);
          resolve(m.get_model(id));
        } else if (++tries > 120) {
          clearInterval(timer);
          reject(new Error('the kernel has no widget ' + id));
        }
      }, 250);
    });
  }

  function draw(output, index) {
    var node = document.createElement('div');
    node.className = 'jp-OutputArea-output';
    var type = output.output_type;
    if (type === 'stream') {
      node.dataset.mimeType = 'application/vnd.jupyter.' + (output.name === 'stderr' ? 'stderr' : 'stdout');
      node.innerHTML = '<pre class="jp-RenderedText"></pre>';
      node.firstChild.innerHTML = ansi(text(output.text));
      return node;
    }
    if (type === 'error') {
      node.dataset.mimeType = 'application/vnd.jupyter.stderr';
      node.innerHTML = '<pre class="jp-RenderedText"></pre>';
      node.firstChild.innerHTML = ansi((output.traceback || []).join('\n') || output.ename + ': ' + output.evalue);
      return node;
    }
    var data = output.data || {};
    var mimeType = preferred(data);
    var value = data[mimeType];
    node.dataset.mimeType = mimeType;
    if (mimeType === 'application/vnd.jupyter.widget-view+json') {
      widget(node, value);
    } else if (VEGA.test(mimeType)) {
      vega(node, mimeType, value, index);
    } else if (mimeType === PLOTLY) {
      plotly(node, value, index);
    } else if (mimeType === 'application/javascript' || mimeType === 'text/javascript') {
      var element = document.createElement('div');
      node.appendChild(element);
      self.element = element;
      run(text(value));
    } else if (mimeType === 'text/html' || mimeType === 'image/svg+xml') {
      node.className += ' jp-RenderedHTMLCommon' + (mimeType === 'image/svg+xml' ? ' jp-RenderedSVG' : ' jp-RenderedHTML');
      html(node, text(value));
      typeset(node);
    } else if (mimeType === 'text/markdown') {
      node.className += ' jp-RenderedHTMLCommon jp-RenderedMarkdown';
      var rendered = output.kernel_sandbox_markdown;
      if (typeof rendered === 'string') html(node, rendered);
      else node.innerHTML = '<pre>' + escape(text(value)) + '</pre>';
      typeset(node);
    } else if (mimeType === 'text/latex') {
      node.className += ' jp-RenderedLatex';
      node.textContent = text(value);
      typeset(node);
    } else if (IMAGES.indexOf(mimeType) >= 0) {
      node.className += ' jp-RenderedImage';
      var img = document.createElement('img');
      img.src = 'data:' + mimeType + ';base64,' + text(value).replace(/\s/g, '');
      var meta = (output.metadata && output.metadata[mimeType]) || {};
      if (typeof meta.width === 'number') img.width = meta.width;
      if (typeof meta.height === 'number') img.height = meta.height;
      node.appendChild(img);
    } else {
      node.innerHTML = '<pre class="jp-RenderedText"></pre>';
      node.firstChild.innerHTML = ansi(text(value));
    }
    return node;
  }

  // What an output is drawn from: a chart's output is the same without the PNG the page saved of it
  function drawnFrom(output) {
    var data = output.data;
    if (!data || data['image/png'] === undefined || !(VEGA.test(preferred(data)) || preferred(data) === PLOTLY)) {
      return JSON.stringify(output);
    }
    var rest = {};
    Object.keys(data).forEach(function (t) {
      if (t !== 'image/png') rest[t] = data[t];
    });
    return JSON.stringify([output.output_type, rest, output.metadata, output.execution_count]);
  }

  function render(outputs) {
    for (var i = 0; i < outputs.length; i++) {
      var json = drawnFrom(outputs[i]);
      if (slots[i] && slots[i].json === json) continue;
      var node = draw(outputs[i], i);
      if (slots[i]) root.replaceChild(node, slots[i].node);
      else root.appendChild(node);
      slots[i] = { json: json, node: node };
    }
    while (slots.length > outputs.length) {
      root.removeChild(slots.pop().node);
    }
  }

  // The bridge the widget manager's comms use (frame/widgets.js)
  var bridge = {
    comm: function (target, id) {
      var Comm = self.kernelSandboxWidgetComm;
      var comm = new Comm(bridge, target, id);
      comms[id] = comm;
      return comm;
    },
    open: function (comm, data, metadata) {
      post('comm-open', { comm_id: comm.comm_id, target: comm.target_name, data: data || {}, metadata: metadata || {} });
      return '';
    },
    send: function (comm, data, callbacks, buffers) {
      var id = 'frame-' + ++requests;
      sent[id] = callbacks;
      var list = (buffers || []).map(function (b) {
        return b instanceof ArrayBuffer ? b : b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength);
      });
      post('comm-send', { comm_id: comm.comm_id, id: id, data: data, buffers: list });
      return id;
    },
    close: function (comm) {
      delete comms[comm.comm_id];
      post('comm-close', { comm_id: comm.comm_id });
    },
    // the manager has its models (or asks for each model's state itself): the kernel's messages apply from now on
    live: function () {
      phase = 'live';
      var queued = held;
      held = [];
      queued.forEach(receive);
    },
    commInfo: function () {
      var request = ++requests;
      return new Promise(function (resolve) {
        pendingInfo[request] = resolve;
        post('comm-info', { request: request });
      });
    }
  };

  function widgets() {
    if (!managerReady) {
      managerReady = need('widgets').then(function () {
        manager = self.kernelSandboxWidgets(bridge);
        manager.loading = manager
          .load()
          .catch(function (error) {
            console.warn('kernel-sandbox: widget states not loaded', error);
          })
          .then(bridge.live);
        return manager;
      });
    }
    return managerReady;
  }

  function receive(msg) {
    var content = msg.content || {};
    var control = comms[content.comm_id] && comms[content.comm_id].target_name === 'jupyter.widget.control';
    if (control) {
      if (phase === 'waiting') phase = 'loading';
      comms[content.comm_id].handle(msg);
      return;
    }
    if (phase === 'waiting') return;
    if (phase === 'loading') {
      held.push(msg);
      return;
    }
    if (msg.header.msg_type === 'comm_open') {
      if (manager.has_model(content.comm_id)) return;
      manager.handle_comm_open(bridge.comm(content.target_name, content.comm_id), msg);
      return;
    }
    var comm = comms[content.comm_id];
    if (comm) comm.handle(msg);
    if (msg.header.msg_type === 'comm_close') delete comms[content.comm_id];
  }

  window.addEventListener('message', function (event) {
    var data = event.data;
    if (event.source !== parent || !data || typeof data.type !== 'string' || data.type.indexOf(prefix) !== 0) return;
    var type = data.type.slice(prefix.length);
    if (type === 'outputs') {
      render(data.outputs);
    } else if (type === 'load' && waiting[data.name]) {
      if (data.name === 'mathjax') {
        // an opaque origin has no storage: MathJax's menu reads its settings from there
        var memory = {};
        Object.defineProperty(self, 'localStorage', {
          configurable: true,
          value: {
            getItem: function (key) {
              return Object.prototype.hasOwnProperty.call(memory, key) ? memory[key] : null;
            },
            setItem: function (key, value) {
              memory[key] = String(value);
            },
            removeItem: function (key) {
              delete memory[key];
            }
          }
        });
        self.MathJax = {
          startup: { typeset: false },
          tex: { inlineMath: [['$', '$'], ['\\(', '\\)']], displayMath: [['$$', '$$'], ['\\[', '\\]']], processEscapes: true },
          svg: { fontCache: 'local' },
          options: { enableMenu: false }
        };
      }
      run(data.source);
      waiting[data.name]();
      delete waiting[data.name];
    } else if (type === 'comm') {
      receive(data.msg);
    } else if (type === 'comm-status') {
      var callbacks = sent[data.id];
      if (callbacks && callbacks.iopub && callbacks.iopub.status) {
        callbacks.iopub.status({ header: { msg_type: 'status' }, content: { execution_state: data.state } });
      }
      if (data.state === 'idle') delete sent[data.id];
    } else if (type === 'comm-info' && pendingInfo[data.request]) {
      pendingInfo[data.request](data.comms || {});
      delete pendingInfo[data.request];
    }
  });

  function report() {
    var height = Math.max(document.documentElement.scrollHeight, document.body ? document.body.scrollHeight : 0);
    post('height', { height: height });
  }
  new ResizeObserver(report).observe(document.documentElement);
  window.addEventListener('load', report);
  post('ready');
}
