// kernel-sandbox-frame: what sandboxed kernels show renders in opaque-origin iframes, never in the page.
//
// Every output area of a notebook or console whose kernelspec names a kernel-sandbox provisioner (or is not
// known: fail closed), and every output area holding an output the policy marked (metadata
// kernel_sandbox.framed, whatever kernel the notebook has now), gets ONE <iframe sandbox="allow-scripts"> (no
// allow-same-origin: an opaque origin, no cookie, no same-origin request, no access to the page) whose document
// forbids every network load by its CSP. The page draws none of the area's outputs: it sends them, as nbformat
// JSON, to the frame (src/frame.js), which draws text, errors, images, HTML, SVG, Markdown, LaTeX (MathJax),
// Vega, Plotly and ipywidgets views itself. The frame's widget manager gets the kernel's widget comms from the page's
// relay, which never makes a widget model in the page; what the frame sends back is checked (comm ids the kernel
// opened, message kinds, sizes). The tooltip and the inspector render a kernel's rich help in such a frame too.
// Bridge messages: bridge.md.
//
// A second plugin adds the command "Restart Kernel, Keep Variables" for notebooks on a sandboxed kernel:
// %checkpoint (the launcher keeps the blob on the host), a restart, then %restore in the new kernel.
import { Dialog, ICommandPalette, IThemeManager, Notification, showDialog } from '@jupyterlab/apputils';
import { IConsoleTracker } from '@jupyterlab/console';
import { INotebookTracker, INotebookWidgetFactory } from '@jupyterlab/notebook';
import { OutputArea } from '@jupyterlab/outputarea';
import { ITooltipManager } from '@jupyterlab/tooltip';
import { Widget } from '@lumino/widgets';

import { frameMain } from './frame.js';
import { WidgetStates, arrayBuffer, isPlainObject } from './states';
import { themeLightAttribute, updateTheme, usableHandlers, usableHead } from './usable';

// Rendered by JupyterLab without script or page-wide layout: a tooltip or inspector showing only these is left as it is.
const INERT = new Set([
  'text/plain',
  'application/vnd.jupyter.stdout',
  'application/vnd.jupyter.stderr',
  'image/png',
  'image/jpeg',
  'image/gif',
  'image/bmp',
  'image/webp',
  'text/latex'
]);
const PREFIX = 'kernel-sandbox-frame:';
const MAX_HEIGHT = 20000;
const CSP = [
  "default-src 'none'",
  "script-src 'unsafe-inline' 'unsafe-eval'",
  "style-src 'unsafe-inline'",
  'img-src data: blob:',
  'font-src data:',
  "form-action 'none'",
  "base-uri 'none'"
].join('; ');
// The renderers a frame may ask for, loaded once by the page (each is a chunk of its own) and sent as text
const RENDERERS = {
  widgets: () => import('./widgets-source.js'),
  vega: () => import('./vega-source.js'),
  plotly: () => import('./plotly-source.js'),
  mathjax: () => import('./mathjax-source.js')
};
const WIDGET = 'jupyter.widget';
const CONTROL = 'jupyter.widget.control';
const WIDGET_TARGETS = new Set([WIDGET, CONTROL, 'jupyter.widget.version']);
// What a frame may send on a widget comm, and how much (the launcher's own cap on a client's message)
const WIDGET_METHODS = new Set(['update', 'custom', 'request_state']);
const MAX_SEND_BYTES = 64 * 1024 * 1024;
const MAX_CONTROLS = 4;
const MARK = 'kernel_sandbox';
const STYLE = `
.kernel-sandbox-area > .jp-OutputArea-child:not(:has(.jp-Stdin)) { height: 0; min-height: 0; overflow: hidden; margin: 0; padding: 0; }
iframe.kernel-sandbox-frame { width: 100%; height: 24px; border: 0; display: block; background: transparent; }
`;

const FRAME_SCRIPT = `(${frameMain.toString()})(${JSON.stringify(PREFIX)});`.replace(/<\/(script)/gi, '<\\/$1');
// The frame's document: its CSP, JupyterLab's theme and the usable.js scripts (search, shortcuts, context menu), then ours
function frameDocument() {
  return (
    '<!DOCTYPE html><html><head><meta charset="utf-8">' +
    `<meta http-equiv="Content-Security-Policy" content="${CSP}">` +
    '<style>html,body{margin:0;padding:0;background:transparent;overflow-y:hidden}body{padding:2px 0}' +
    'pre{margin:0;white-space:pre-wrap;word-break:break-all;font-family:var(--jp-code-font-family,monospace);' +
    'font-size:var(--jp-code-font-size,13px)}' +
    '[data-mime-type="application/vnd.jupyter.stderr"]{background:var(--jp-rendermime-error-background,#fdd)}</style>' +
    `${usableHead()}</head><body ${themeLightAttribute()}><div id="outputs"></div><script>${FRAME_SCRIPT}</script></body></html>`
  );
}

// The page's handlers of usable.js's messages (text for search, shortcuts, the context menu), set at activation
let handlers = {};

// Every frame this extension made: {frame, outputs(), relay(), host} (a frame's window changes when JupyterLab re-attaches it)
const entries = new Set();

function entryOf(source) {
  for (const entry of entries) {
    if (entry.frame.contentWindow === source) {
      return entry;
    }
  }
  return null;
}

function post(entry, type, fields = {}, transfer = []) {
  const target = entry.frame.contentWindow;
  if (target) {
    target.postMessage({ ...fields, type: PREFIX + type }, '*', transfer);
  }
}

function makeFrame(entry) {
  const frame = document.createElement('iframe');
  frame.setAttribute('sandbox', 'allow-scripts');
  frame.setAttribute('referrerpolicy', 'no-referrer');
  frame.setAttribute('allow', "focus-without-user-activation 'none'; camera 'none'; microphone 'none'; display-capture 'none'; geolocation 'none'");
  frame.setAttribute('title', 'output of a sandboxed kernel');
  frame.className = 'kernel-sandbox-frame';
  frame.inert = true; // until the pointer is over it (guardFocus)
  frame.srcdoc = frameDocument();
  entry.frame = frame;
  entry.loaded = new Set();
  entries.add(entry);
  return frame;
}

function dropEntry(entry) {
  entries.delete(entry);
  const relay = entry.relay();
  if (relay) {
    relay.forget(entry);
  }
}

function text(value) {
  return Array.isArray(value) ? value.join('') : typeof value === 'string' ? value : JSON.stringify(value);
}

// Outputs as the frame takes them; Markdown also as the HTML JupyterLab's parser makes of it (a string: the page
// builds no DOM of it)
async function withMarkdown(outputs, parser) {
  return Promise.all(
    outputs.map(async output => {
      const markdown = output.data && output.data['text/markdown'];
      if (markdown === undefined || !parser) {
        return output;
      }
      return { ...output, kernel_sandbox_markdown: await parser.render(text(markdown)) };
    })
  );
}

async function sendOutputs(entry) {
  entry.scheduled = false;
  if (entry.ready) {
    post(entry, 'outputs', { outputs: await entry.outputs() });
  }
}

function schedule(entry) {
  if (!entry.scheduled) {
    entry.scheduled = true;
    setTimeout(() => void sendOutputs(entry), 10);
  }
}

async function answerNeed(entry, name) {
  if (!Object.prototype.hasOwnProperty.call(RENDERERS, name) || entry.loaded.has(name)) {
    return;
  }
  entry.loaded.add(name);
  const source = (await RENDERERS[name]()).default;
  post(entry, 'load', { name, source });
  if (name === 'widgets') {
    const relay = entry.relay();
    if (relay) {
      relay.join(entry);
    }
  }
}

// A frame's widget messages from before its kernel connection exists (a reloaded page draws a notebook's frames
// first), held until attach() has the kernel's relay; bounded, and dropped with the frame's document
const HELD_MAX = 256;

function hold(entry, type, data) {
  entry.held = entry.held || [];
  if (entry.held.length < HELD_MAX) {
    entry.held.push([type, data]);
  }
}

function release(relay) {
  for (const entry of entries) {
    if (entry.held && entry.held.length && entry.relay() === relay) {
      const held = entry.held;
      entry.held = [];
      relay.join(entry);
      held.forEach(([type, data]) => relay.fromFrame(entry, type, data));
    }
  }
}

function onMessage(event) {
  const data = event.data;
  if (event.origin !== 'null' || !data || typeof data !== 'object' || typeof data.type !== 'string' || !data.type.startsWith(PREFIX)) {
    return;
  }
  const entry = entryOf(event.source);
  if (!entry) {
    return;
  }
  if (Object.prototype.hasOwnProperty.call(handlers, data.type)) {
    handlers[data.type](entry.frame, data);
    return;
  }
  const type = data.type.slice(PREFIX.length);
  const relay = entry.relay();
  if (type === 'ready') {
    // a new document: what the last one loaded and opened is gone
    entry.ready = true;
    entry.loaded = new Set();
    entry.held = [];
    if (relay) {
      relay.forget(entry);
    }
    void sendOutputs(entry);
  } else if (type === 'height') {
    const height = data.height;
    if (typeof height === 'number' && Number.isFinite(height) && height >= 0) {
      entry.frame.style.height = `${Math.ceil(Math.min(height, MAX_HEIGHT))}px`;
    }
  } else if (type === 'need') {
    void answerNeed(entry, data.name);

  } else if (entry.loaded.has('widgets')) {
    if (relay) {
      relay.join(entry);
      relay.fromFrame(entry, type, data);
    } else {
      hold(entry, type, data);
    }
  }
}

// Focus is the user's to give. Every frame is `inert` (no focus, no pointer events: its script's focus() does
// nothing) but the one under the pointer, which the page sees move over the frame's place (an inert frame lets
// the pointer through to the page). A frame keeps its pointer events while it holds a focus the user gave it.
// Focus that still moves into a frame (Chromium lets an inert frame's script focus itself) goes back where it was
// when the frame is inert or the user is typing in the page, and the frame is inert again until the pointer next
// moves over it: a widget calling focus() cannot take a cell's keystrokes.
const focusGuard = { last: null, typed: 0, hovered: null };

function frameAt(event) {
  for (const entry of entries) {
    const box = entry.frame.getBoundingClientRect();
    if (event.clientX >= box.left && event.clientX < box.right && event.clientY >= box.top && event.clientY < box.bottom) {
      return entry.frame;
    }
  }
  return null;
}

function settle(frame) {
  if (frame && frame !== focusGuard.hovered && document.activeElement !== frame) {
    frame.inert = true;
  }
}

function guardFocus() {
  document.addEventListener(
    'pointermove',
    event => {
      const frame = event.target instanceof HTMLIFrameElement ? event.target : frameAt(event);
      if (frame !== focusGuard.hovered) {
        const left = focusGuard.hovered;
        focusGuard.hovered = frame && entryOf(frame.contentWindow) ? frame : null;
        settle(left);
        if (focusGuard.hovered && Date.now() - focusGuard.typed > 1000) {
          focusGuard.hovered.inert = false;
        }
      }
    },
    { capture: true, passive: true }
  );
  document.addEventListener(
    'focusin',
    event => {
      if (!(event.target instanceof HTMLIFrameElement)) {
        focusGuard.last = event.target;
        for (const entry of entries) {
          settle(entry.frame);
        }
      }
    },
    true
  );
  document.addEventListener('keydown', () => (focusGuard.typed = Date.now()), true);
  const check = () => {
    const active = document.activeElement;
    if (active instanceof HTMLIFrameElement && entryOf(active.contentWindow) && (active.inert || Date.now() - focusGuard.typed < 1000)) {
      active.inert = true;
      const back = focusGuard.last && document.contains(focusGuard.last) ? focusGuard.last : document.body;
      back.focus();
    }
  };
  // the page's activeElement becomes the frame some time after the page's blur
  window.addEventListener('blur', () => [0, 20, 60, 150, 300].forEach(delay => setTimeout(check, delay)));
}

function isCommId(value) {
  return typeof value === 'string' && value.length > 0 && value.length <= 128;
}

// The output a kernel message adds, in nbformat's shape
function outputOf(msg) {
  const type = msg.header.msg_type;
  const content = msg.content;
  if (type === 'stream') {
    return { output_type: type, name: content.name, text: content.text };
  }
  if (type === 'error') {
    return { output_type: type, ename: content.ename, evalue: content.evalue, traceback: content.traceback };
  }
  const output = { output_type: type, data: content.data, metadata: content.metadata || {} };
  return type === 'execute_result' ? { ...output, execution_count: content.execution_count } : output;
}

// The widget comms of one sandboxed kernel. The kernel's comm_open/comm_msg/comm_close on them go to every frame
// that loaded the widget manager; a frame's comm_msg goes to the kernel only on a comm the kernel opened (or told of
// in its states), its control comm carries request_states only. No one else on the page gets these comm targets:
// ipywidgets' own manager (jupyterlab_widgets) cannot register them, open them or list them on this kernel.
class Relay {
  constructor(kernel) {
    this.kernel = kernel;
    this.comms = new Map(); // comm_id -> the kernel's widget comm
    this.controls = new Map(); // comm_id -> {comm, entry, version}: frames' request_states (comm: once asked)
    this.frames = new Set();
    this.sent = new Map(); // kernel msg_id of a frame's message -> {entry, id}
    this.outputWidgets = new Map(); // Output widget comm_id -> {outputs, msgId, hook, clearWait}
    this.states = new WidgetStates(); // what a frame's request_states gets at once, once complete
    const refuse = name => new Error(`kernel-sandbox: the widgets of a sandboxed kernel live in its output frames (${name})`);
    this.register = kernel.registerCommTarget.bind(kernel);
    this.create = kernel.createComm.bind(kernel);
    const commInfo = kernel.requestCommInfo.bind(kernel);
    this.commInfo = commInfo;
    kernel.registerCommTarget = (name, callback) => (WIDGET_TARGETS.has(name) ? undefined : this.register(name, callback));
    kernel.createComm = (name, id) => {
      if (WIDGET_TARGETS.has(name)) {
        throw refuse(name);
      }
      return this.create(name, id);
    };
    kernel.requestCommInfo = async content => {
      if (content && WIDGET_TARGETS.has(content.target_name)) {
        throw refuse('comm_info');
      }
      const reply = await commInfo(content);
      const comms = (reply.content && reply.content.comms) || {};
      for (const id of Object.keys(comms)) {
        if (comms[id] && WIDGET_TARGETS.has(comms[id].target_name)) {
          delete comms[id]; // a listing of every comm leaves the widgets out
        }
      }
      return reply;
    };
    this.register(WIDGET, (comm, msg) => this.adopt(comm, msg));
    // the states are complete when the kernel has no widget comm they lack (it had none before this page: a fresh
    // kernel); else (a page reloaded) frames ask the kernel until one of its answers fills them
    commInfo({ target_name: WIDGET }).then(
      reply => this.states.listed(Object.keys((reply.content && reply.content.comms) || {})),
      () => undefined
    );
    // a kernel's comm on the other targets is not a widget the page knows: left unanswered, it is closed
    kernel.statusChanged.connect((_, status) => {
      if (status === 'restarting' || status === 'autorestarting' || status === 'dead') {
        this.comms.clear();
        this.controls.clear();
        this.sent.clear();
        for (const watched of this.outputWidgets.values()) {
          this.unhook(watched);
        }
        this.outputWidgets.clear();
        this.states.clear();
      }
    });
  }

  adopt(comm, msg) {
    this.comms.set(comm.commId, comm);
    comm.onMsg = m => this.fromKernel(m);
    comm.onClose = m => {
      this.fromKernel(m);
      this.comms.delete(comm.commId);
    };
    if (msg) {
      this.fromKernel(msg);
    }
  }

  // A comm the kernel says it has (its states after a reload): the page opens its end, sending nothing
  learn(id) {
    if (!isCommId(id) || this.comms.has(id)) {
      return;
    }
    try {
      this.adopt(this.create(WIDGET, id), null);
    } catch (error) {
      console.warn('kernel-sandbox: widget comm not joined', error);
    }
  }

  join(entry) {
    this.frames.add(entry);
  }

  forget(entry) {
    this.frames.delete(entry);
    for (const [id, control] of this.controls) {
      if (control.entry === entry) {
        this.controls.delete(id);
        control.comm?.close();
      }
    }
  }

  toFrame(entry, msg) {
    const parent = msg.parent_header && msg.parent_header.msg_id;
    const mine = this.sent.get(parent);
    const forwarded = {
      header: { msg_type: msg.header.msg_type },
      parent_header: { msg_id: mine && mine.entry === entry ? mine.id : parent },
      content: msg.content,
      metadata: msg.metadata || {},
      buffers: (msg.buffers || []).map(arrayBuffer)
    };
    post(entry, 'comm', { msg: forwarded });
  }

  fromKernel(msg) {
    this.watchOutputWidget(msg);
    const content = msg.content || {};
    const data = content.data;
    if (msg.header.msg_type === 'comm_open') {
      this.states.open(content.comm_id, data, msg.buffers || []);
    } else if (msg.header.msg_type === 'comm_close') {
      this.states.close(content.comm_id);
    } else if (data && (data.method === 'update' || data.method === 'echo_update')) {
      this.states.update(content.comm_id, data, msg.buffers || []);
    }
    if (data && data.method === 'custom' && data.content && data.content.do === 'focus') {
      return; // a widget's focus(): focus is the user's to give
    }
    for (const entry of this.frames) {
      if (entries.has(entry)) {
        this.toFrame(entry, msg);
      } else {
        this.frames.delete(entry);
      }
    }
  }

  fromFrame(entry, type, data) {
    if (type === 'comm-send') {
      this.send(entry, data);
    } else if (type === 'comm-open') {
      this.openControl(entry, data);
    } else if (type === 'comm-close') {
      const control = this.controls.get(data.comm_id);
      if (control && control.entry === entry) {
        this.controls.delete(data.comm_id);
        control.comm?.close();
      }
    } else if (type === 'comm-info' && typeof data.request === 'number') {
      this.commInfo({ target_name: WIDGET }).then(
        reply => {
          const comms = {};
          for (const id of Object.keys((reply.content && reply.content.comms) || {})) {
            this.learn(id);
            comms[id] = { target_name: WIDGET };
          }
          post(entry, 'comm-info', { request: data.request, comms });
        },
        () => post(entry, 'comm-info', { request: data.request, comms: {} })
      );
    }
  }

  // A frame's control comm is opened in the kernel only with its request_states, in one go: ipywidgets answers on
  // the control comm the kernel opened last, so two frames' opens before their requests (a busy kernel, several
  // widget outputs at once) would send both answers to one frame and none to the other
  openControl(entry, data) {
    const ours = [...this.controls.values()].filter(control => control.entry === entry).length;
    if (data.target !== CONTROL || !isCommId(data.comm_id) || this.controls.has(data.comm_id) || ours >= MAX_CONTROLS) {
      return;
    }
    const version = isPlainObject(data.metadata) && typeof data.metadata.version === 'string' ? data.metadata.version.slice(0, 20) : undefined;
    this.controls.set(data.comm_id, { comm: null, entry, version });
  }

  controlComm(id, control) {
    if (control.comm) {
      return control.comm;
    }
    try {
      control.comm = this.create(CONTROL, id);
    } catch (error) {
      this.controls.delete(id);
      return null;
    }
    control.comm.onMsg = msg => {
      const states = msg.content && msg.content.data && msg.content.data.states;
      if (isPlainObject(states)) {
        this.states.replace(msg.content.data, msg.buffers || []);
        Object.keys(states).forEach(widget => this.learn(widget));
        for (const [widget, state] of Object.entries(states)) {
          this.watchState(widget, state && state.state);
        }
      }
      this.toFrame(control.entry, msg);
    };
    control.comm.onClose = msg => {
      this.controls.delete(id);
      this.toFrame(control.entry, msg);
    };
    control.comm.open({}, control.version ? { version: control.version } : {});
    return control.comm;
  }

  send(entry, data) {
    const id = data.comm_id;
    const control = this.controls.get(id);
    const payload = data.data;
    const buffers = Array.isArray(data.buffers) ? data.buffers : [];
    if (!isPlainObject(payload) || !buffers.every(b => b instanceof ArrayBuffer) || typeof data.id !== 'string' || data.id.length > 64) {
      return;
    }
    if (control && control.entry === entry && payload.method === 'request_states' && this.states.complete) {
      // answered at once from what the page has seen pass, even while the kernel runs a cell
      const { data: answer, buffers: held } = this.states.snapshot();
      const reply = { header: { msg_type: 'comm_msg' }, parent_header: { msg_id: data.id }, content: { comm_id: id, data: answer } };
      post(entry, 'comm', { msg: { ...reply, metadata: {}, buffers: held.map(arrayBuffer) } });
      post(entry, 'comm-status', { id: data.id, state: 'idle' });
      return;
    }
    let comm;
    if (control && control.entry === entry) {
      comm = payload.method === 'request_states' ? this.controlComm(id, control) : null;
    } else {
      comm = WIDGET_METHODS.has(payload.method) ? this.comms.get(id) : null;
    }
    let size = buffers.reduce((total, b) => total + b.byteLength, 0);
    if (!comm || size > MAX_SEND_BYTES || (size += JSON.stringify(payload).length) > MAX_SEND_BYTES) {
      return;
    }
    let future;
    try {
      future = comm.send(payload, {}, buffers);
    } catch (error) {
      return;
    }
    const msgId = future.msg.header.msg_id;
    this.sent.set(msgId, { entry, id: data.id });
    if (this.sent.size > 1000) {
      this.sent.delete(this.sent.keys().next().value);
    }
    future.onIOPub = msg => {
      if (msg.header.msg_type === 'status') {
        post(entry, 'comm-status', { id: data.id, state: msg.content.execution_state });
      }
    };
    future.done.then(
      () => setTimeout(() => this.sent.delete(msgId), 5000),
      () => this.sent.delete(msgId)
    );
  }

  // The Output widget (`with out:`) takes the outputs of the messages its msg_id names: the page catches them
  // before the cell does and hands them to the kernel as the widget's `outputs` (which the frames then show, and
  // which a reloaded page gets back from the kernel)
  watchOutputWidget(msg) {
    const content = msg.content || {};
    const data = content.data || {};
    if (msg.header.msg_type === 'comm_close') {
      const watched = this.outputWidgets.get(content.comm_id);
      if (watched) {
        this.unhook(watched);
        this.outputWidgets.delete(content.comm_id);
      }
    } else if (msg.header.msg_type === 'comm_open' || data.method === 'update' || data.method === 'echo_update') {
      this.watchState(content.comm_id, data.state);
    }
  }

  watchState(id, state) {
    if (!isCommId(id) || !isPlainObject(state)) {
      return;
    }
    let watched = this.outputWidgets.get(id);
    if (!watched) {
      if (state._model_name !== 'OutputModel' || state._model_module !== '@jupyter-widgets/output') {
        return;
      }
      watched = { outputs: [], msgId: '', hook: null, clearWait: false, id };
      this.outputWidgets.set(id, watched);
    }
    if (Array.isArray(state.outputs)) {
      watched.outputs = state.outputs;
    }
    if (typeof state.msg_id === 'string' && state.msg_id !== watched.msgId) {
      this.unhook(watched);
      watched.msgId = state.msg_id;
      if (state.msg_id) {
        watched.hook = msg => this.capture(watched, msg);
        this.kernel.registerMessageHook(state.msg_id, watched.hook);
      }
    }
  }

  unhook(watched) {
    if (watched.hook) {
      this.kernel.removeMessageHook(watched.msgId, watched.hook);
      watched.hook = null;
    }
  }

  capture(watched, msg) {
    const type = msg.header.msg_type;
    if (!['stream', 'display_data', 'execute_result', 'error', 'clear_output'].includes(type)) {
      return true;
    }
    if (type === 'clear_output') {
      if (msg.content.wait) {
        watched.clearWait = true;
      } else {
        watched.outputs = [];
      }
    } else {
      const outputs = watched.clearWait ? [] : [...watched.outputs];
      watched.clearWait = false;
      const output = outputOf(msg);
      const last = outputs[outputs.length - 1];
      if (type === 'stream' && last && last.output_type === 'stream' && last.name === output.name) {
        outputs[outputs.length - 1] = { ...last, text: text(last.text) + text(output.text) };
      } else {
        outputs.push(output);
      }
      watched.outputs = outputs;
    }
    const comm = this.comms.get(watched.id);
    if (comm) {
      const update = { method: 'update', state: { outputs: watched.outputs }, buffer_paths: [] };
      comm.send(update, {}, []);
      this.fromKernel({ header: { msg_type: 'comm_msg' }, parent_header: {}, content: { comm_id: watched.id, data: update }, metadata: {}, buffers: [] });
    }
    return false;
  }
}

const relays = new WeakMap();

function relayOf(kernel) {
  if (!kernel) {
    return null;
  }
  let relay = relays.get(kernel);
  if (!relay) {
    relay = new Relay(kernel);
    relays.set(kernel, relay);
  }
  return relay;
}

// The panels whose rendermime this extension wrapped: rendermime -> {framed(), kernel()}
const hosts = new WeakMap();

function marked(model) {
  for (let i = 0; i < model.length; i++) {
    const metadata = model.get(i).metadata;
    const mark = metadata && metadata[MARK];
    if (mark && typeof mark === 'object' && mark.framed === true) {
      return true;
    }
  }
  return false;
}

const FRAMED = Symbol('kernel-sandbox-frame');

// The area's frame, made when the area first has an output to frame; it stays until the area is emptied
function areaFrame(area) {
  if (area[FRAMED]) {
    return area[FRAMED];
  }
  const host = hosts.get(area.rendermime);
  if (!((host && host.framed()) || marked(area.model))) {
    return null;
  }
  const entry = {
    outputs: () => withMarkdown(area.model.toJSON(), area.rendermime.markdownParser),
    relay: () => {
      const kernel = host && host.framed() ? host.kernel() : null;
      return kernel ? relayOf(kernel) : null;
    },
  };
  area[FRAMED] = entry;
  area.node.appendChild(makeFrame(entry));
  area.addClass('kernel-sandbox-area');
  const changed = () => {
    if (area.model.length === 0 && !(host && host.framed())) {
      unframe(area);
    } else {
      schedule(entry);
    }
  };
  area.model.changed.connect(changed);
  area.model.stateChanged.connect(changed);
  area.disposed.connect(() => dropEntry(entry));
  entry.disconnect = () => {
    area.model.changed.disconnect(changed);
    area.model.stateChanged.disconnect(changed);
  };
  return entry;
}

function unframe(area) {
  const entry = area[FRAMED];
  delete area[FRAMED];
  entry.disconnect();
  dropEntry(entry);
  entry.frame.remove();
  area.removeClass('kernel-sandbox-area');
}

// Each output area draws nothing of a framed area's outputs: its items hold an empty slot, the frame shows them all
function patchOutputArea() {
  const render = OutputArea.prototype.createRenderedMimetype;
  OutputArea.prototype.createRenderedMimetype = function (model) {
    const entry = areaFrame(this);
    if (!entry) {
      return render.call(this, model);
    }
    schedule(entry);
    const slot = new Widget();
    slot.addClass('kernel-sandbox-slot');
    slot.renderModel = () => {
      schedule(entry);
      return Promise.resolve();
    };
    return slot;
  };
}

// A rendering outside an output area (the tooltip's, the inspector's inspect_reply) in a frame of its own
function renderInFrame(renderer, model, options) {
  const data = model.data;
  const entry = {
    outputs: () => withMarkdown([{ output_type: 'display_data', data, metadata: model.metadata || {} }], options.markdownParser),
    relay: () => null
  };
  const node = renderer.node;
  while (node.firstChild) {
    node.removeChild(node.firstChild);
  }
  node.classList.add('kernel-sandbox-framed');
  node.appendChild(makeFrame(entry));
  renderer.disposed.connect(() => dropEntry(entry));
  return Promise.resolve();
}

// The user's own Markdown cell: its MimeModel has no output type (display_data, execute_result...) and
// the cell marks its renderer before rendering. Everything else a panel's rendermime draws is the
// kernel's: outputs, the tooltip's and the inspector's inspect_reply bundles (MimeModels too).
function isMarkdownCell(renderer, model) {
  return typeof model.type !== 'string' && renderer.hasClass('jp-MarkdownOutput');
}

// A factory that makes the original renderer, whose renderModel draws into a frame when `framed()`.
function framingFactory(original, mimeType, framed) {
  return {
    safe: original.safe,
    mimeTypes: [mimeType],
    defaultRank: original.defaultRank,
    createRenderer(options) {
      const renderer = original.createRenderer(options);
      const render = renderer.renderModel.bind(renderer);
      renderer.renderModel = model => (!isMarkdownCell(renderer, model) && framed() ? renderInFrame(renderer, model, options) : render(model));
      return renderer;
    }
  };
}

// Wraps, in place, every factory of `rendermime` that can run script or lay out HTML.
function frameFactories(rendermime, framed) {
  for (const mimeType of rendermime.mimeTypes) {
    if (INERT.has(mimeType)) {
      continue;
    }
    const original = rendermime.getFactory(mimeType);
    const rank = rendermime.getRank(mimeType);
    rendermime.addFactory(framingFactory(original, mimeType, framed), rank);
  }
}

function kernelspecOf(specs, name) {
  return name && specs && specs.kernelspecs ? specs.kernelspecs[name] : undefined;
}

// What `kernel-sandbox install` writes into a kernelspec's metadata of its backend
// ({backend, magics}: kernel_sandbox/backends.py, BackendEntry.identity), if anything
function identityOf(spec) {
  const identity = spec.metadata && spec.metadata.kernel_sandbox;
  return identity && typeof identity === 'object' ? identity : null;
}

// A kernel-sandbox backend in its metadata, or the launcher in its argv (every installed kernelspec runs it)
function isSandboxedSpec(spec) {
  if (identityOf(spec)) {
    return true;
  }
  return Array.isArray(spec.argv) && spec.argv.some(arg => typeof arg === 'string' && arg.includes('kernel_sandbox.launch'));
}

const wrapped = new WeakSet();

function isSandboxedKernel(app, name) {
  const spec = kernelspecOf(app.serviceManager.kernelspecs.specs, name);
  return spec === undefined || isSandboxedSpec(spec);
}

function guard(app, rendermime, sessionContext, documentKernel) {
  if (wrapped.has(rendermime)) {
    return;
  }
  wrapped.add(rendermime);
  const kernel = () => (sessionContext.session && sessionContext.session.kernel) || null;
  const framed = () => {
    const current = kernel();
    return isSandboxedKernel(app, (current && current.name) || documentKernel());
  };
  hosts.set(rendermime, { framed, kernel });
  frameFactories(rendermime, framed);
  // the relay takes the widget comm targets as soon as the kernel connection exists (before ipywidgets' manager)
  const attach = () => {
    const current = kernel();
    if (current && framed()) {
      release(relayOf(current));
    }
  };
  sessionContext.kernelChanged.connect(attach);
  attach();
}

// A tooltip renders the kernel's inspect_reply with the rendermime its caller hands over: a notebook's or
// console's (wrapped above), or, for a file editor's, the application's own. For a sandboxed kernel the
// latter is swapped for a framing copy.
function guardTooltips(app, manager) {
  const invoke = manager.invoke.bind(manager);
  manager.invoke = options => {
    const { kernel, rendermime } = options;
    if (!rendermime || wrapped.has(rendermime) || !isSandboxedKernel(app, kernel && kernel.name)) {
      return invoke(options);
    }
    const framing = rendermime.clone();
    frameFactories(framing, () => true);
    wrapped.add(framing);
    return invoke({ ...options, rendermime: framing });
  };
}

function guardNotebook(app, panel) {
  const documentKernel = () => {
    const model = panel.context.model;
    const kernelspec = model && model.getMetadata ? model.getMetadata('kernelspec') : undefined;
    return (kernelspec && typeof kernelspec.name === 'string' && kernelspec.name) || panel.sessionContext.kernelPreference.name;
  };
  const rendermime = panel.content.rendermime;
  if (wrapped.has(rendermime)) {
    return;
  }
  guard(app, rendermime, panel.sessionContext, documentKernel);
  // ipywidgets' manager restores widgets from the notebook's saved state into the page: not a sandboxed kernel's
  const model = panel.context.model;
  const hosted = hosts.get(rendermime);
  const getMetadata = model.getMetadata.bind(model);
  model.getMetadata = key => (key === 'widgets' && hosted.framed() ? undefined : getMetadata(key));
}

function guardConsole(app, panel) {
  guard(app, panel.console.rendermime, panel.sessionContext, () => panel.sessionContext.kernelPreference.name);
}

const plugin = {
  id: 'kernel-sandbox-frame:plugin',
  description: 'Renders what sandboxed kernels show (outputs, widgets, rich help) in opaque-origin sandbox iframes.',
  autoStart: true,
  requires: [INotebookWidgetFactory, INotebookTracker],
  optional: [IConsoleTracker, ITooltipManager, IThemeManager],
  activate(app, notebookFactory, notebooks, consoles, tooltips, themes) {
    handlers = usableHandlers(notebooks);
    if (themes) {
      // at once (the new theme's sheet is loaded when themeChanged fires: no frame keeps the old colours while the
      // page shows the new), and again after the next paint and a second later, should a sheet still be loading
      const update = () => updateTheme([...entries].map(entry => entry.frame));
      themes.themeChanged.connect(() => {
        update();
        requestAnimationFrame(update);
        setTimeout(update, 1000);
      });
    }
    const style = document.createElement('style');
    style.textContent = STYLE;
    document.head.appendChild(style);
    patchOutputArea();
    guardFocus();
    window.addEventListener('message', onMessage);
    if (tooltips) {
      guardTooltips(app, tooltips);
    }
    // widgetCreated fires as the panel is made, before its notebook loads; the tracker is the fallback
    notebookFactory.widgetCreated.connect((_, panel) => guardNotebook(app, panel));
    notebooks.widgetAdded.connect((_, panel) => guardNotebook(app, panel));
    notebooks.forEach(panel => guardNotebook(app, panel));
    if (consoles) {
      consoles.widgetAdded.connect((_, panel) => guardConsole(app, panel));
      consoles.forEach(panel => guardConsole(app, panel));
    }
    document.body.dataset.kernelSandboxFrame = 'active';
  }
};

const RESTART_KEEPING_VARIABLES = 'kernel-sandbox:restart-keep-variables';
const KEEP_TITLE = 'Restart Kernel, Keep Variables';
// The lines of %checkpoint's report that name what it could not save ("Not saved: s (why)",
// "File not saved: path (why)"): their names go into the notification, which shows 140 characters.
const NOT_SAVED = /^(?:File )?not saved: (.+?)(?: \(.*\))?$/i;

// The kernel of notebook `panel` when its kernelspec is known and names a sandboxed backend whose kernels load
// %checkpoint and %restore at start (a subset of isSandboxedSpec's), else null.
function sandboxedKernelOf(app, panel) {
  const session = panel && panel.sessionContext.session;
  const kernel = session && session.kernel;
  const spec = kernel && kernelspecOf(app.serviceManager.kernelspecs.specs, kernel.name);
  const identity = spec && identityOf(spec);
  return identity && identity.magics === true ? kernel : null;
}

// Runs a line magic as a request of its own (not a cell: nothing shows in the notebook, no history) and
// returns whether the kernel answered "ok", the stream text it printed, and its error.
async function runMagic(kernel, code) {
  const future = kernel.requestExecute({ code, silent: false, store_history: false, allow_stdin: false });
  let output = '';
  future.onIOPub = message => {
    if (message.header.msg_type === 'stream') {
      output += message.content.text;
    }
  };
  const { content } = await future.done;
  const error = content.status === 'error' ? `${content.ename}: ${content.evalue}` : `the kernel answered "${content.status}"`;
  return { ok: content.status === 'ok', output: output.trim(), error: content.status === 'ok' ? '' : error };
}

// Resolves when `kernel` reports "idle" (a restarted kernel has answered), rejects if it dies first.
function whenIdle(kernel) {
  return new Promise((resolve, reject) => {
    const check = () => {
      if (kernel.status === 'idle' || kernel.status === 'dead') {
        kernel.statusChanged.disconnect(check);
        kernel.status === 'idle' ? resolve() : reject(new Error('the new kernel died as it started'));
      }
    };
    kernel.statusChanged.connect(check);
    check();
  });
}

// A dialog with the magics' whole reports (the notification shows only their first 140 characters).
function showDetails(text) {
  const pre = document.createElement('pre');
  pre.className = 'kernel-sandbox-keep-details';
  pre.style.cssText = 'white-space:pre-wrap;max-width:70vw;max-height:60vh;overflow:auto';
  pre.textContent = text;
  return showDialog({ title: KEEP_TITLE, body: new Widget({ node: pre }), buttons: [Dialog.okButton()] });
}

// %checkpoint, then (only if it saved) a restart and %restore, reported as one notification that ends as
// success, warning (something was not saved: named) or error (what failed, and whether the kernel restarted).
async function restartKeepingVariables(app, panel) {
  // One notification at the end (meanwhile the kernel's status shows busy, then restarting, as with JupyterLab's
  // own restart): an "in-progress" one updated soon after it is emitted can keep its first text (JupyterLab 4.6).
  const context = panel.sessionContext;
  const log = [];
  const finish = (type, message) =>
    Notification.emit(message, type, {
      autoClose: type === 'success' ? 5000 : false,
      actions: [{ label: 'Details', caption: 'The reports of %checkpoint and %restore', callback: () => showDetails(log.join('\n\n')) }]
    });
  try {
    const saved = await runMagic(context.session.kernel, '%checkpoint');
    log.push(`%checkpoint: ${saved.output || '(no output)'}${saved.error ? `\n${saved.error}` : ''}`);
    if (!saved.ok) {
      return finish('error', `Kernel not restarted: %checkpoint failed (${saved.error})`);
    }
    await context.restartKernel(); // JupyterLab's own restart, without its "all variables will be lost" dialog
    const kernel = context.session && context.session.kernel;
    if (!context.isReady || !kernel) {
      return finish('error', 'The kernel did not restart; its checkpoint is kept: run %restore once it is back');
    }
    await whenIdle(kernel);
    const restored = await runMagic(kernel, '%restore');
    log.push(`%restore: ${restored.output || '(no output)'}${restored.error ? `\n${restored.error}` : ''}`);
    if (!restored.ok) {
      return finish('error', `Kernel restarted, but %restore failed (${restored.error})`);
    }
    const lost = saved.output.split('\n').map(line => NOT_SAVED.exec(line.trim())).filter(Boolean).map(match => match[1]);
    return lost.length
      ? finish('warning', `Kernel restarted, variables kept. Not saved: ${lost.join(', ')}`)
      : finish('success', 'Kernel restarted, variables kept.');
  } catch (error) {
    log.push(String((error && error.stack) || error));
    return finish('error', `Restart keeping variables failed: ${(error && error.message) || error}`);
  }
}

const restartPlugin = {
  id: 'kernel-sandbox-frame:restart-keep-variables',
  description: 'The command "Restart Kernel, Keep Variables" for notebooks on a sandboxed kernel (in the Kernel menu by its schema).',
  autoStart: true,
  requires: [INotebookTracker],
  optional: [ICommandPalette],
  activate(app, notebooks, palette) {
    const running = new WeakSet(); // the session contexts a restart keeping variables is under way in
    app.commands.addCommand(RESTART_KEEPING_VARIABLES, {
      label: KEEP_TITLE,
      caption: 'Save the variables (%checkpoint), restart the kernel, load them back (%restore)',
      // as JupyterLab's notebook commands: the current notebook, when it is the active widget
      isEnabled: () => {
        const panel = notebooks.currentWidget;
        const current = panel !== null && panel === app.shell.currentWidget;
        return current && !running.has(panel.sessionContext) && sandboxedKernelOf(app, panel) !== null;
      },
      execute: async () => {
        const panel = notebooks.currentWidget;
        if (!panel || !sandboxedKernelOf(app, panel) || running.has(panel.sessionContext)) {
          return;
        }
        running.add(panel.sessionContext);
        app.commands.notifyCommandChanged(RESTART_KEEPING_VARIABLES);
        try {
          await restartKeepingVariables(app, panel);
        } finally {
          running.delete(panel.sessionContext);
          app.commands.notifyCommandChanged(RESTART_KEEPING_VARIABLES);
        }
      }
    });
    if (palette) {
      palette.addItem({ command: RESTART_KEEPING_VARIABLES, category: 'Notebook Operations' });
    }
    // the palette and toolbars show the enabled state: refresh it when the notebook, its kernel or the specs change
    const changed = () => app.commands.notifyCommandChanged(RESTART_KEEPING_VARIABLES);
    const watch = panel => panel.sessionContext.kernelChanged.connect(changed);
    notebooks.widgetAdded.connect((_, panel) => watch(panel));
    notebooks.forEach(watch);
    notebooks.currentChanged.connect(changed);
    app.serviceManager.kernelspecs.specsChanged.connect(changed);
  }
};

export default [plugin, restartPlugin];
