// Runs inside an output frame (never in the page): an ipywidgets manager for the standard controls whose comms
// are the page's relay. Built by scripts/vendor-frame.js into one script the page sends to the frames that show
// a widget; `self.kernelSandboxWidgets(bridge)` makes the frame's manager.
import * as base from '@jupyter-widgets/base';
import * as controls from '@jupyter-widgets/controls';
import { HTMLManager } from '@jupyter-widgets/html-manager/lib/htmlmanager';
import * as output from '@jupyter-widgets/html-manager/lib/output';
import '@jupyter-widgets/controls/css/labvariables.css';
import '@jupyter-widgets/controls/css/widgets-base.css';

const MODULES = { '@jupyter-widgets/base': base, '@jupyter-widgets/controls': controls, '@jupyter-widgets/output': output };
const CONTROL = 'jupyter.widget.control';
const ANSWER_MS = 10000;
const CONTROL_VERSION = '1.0.0';

// A comm whose messages go to the page (bridge.send) and come from it (handle)
class Comm {
  constructor(bridge, target, id) {
    this.bridge = bridge;
    this.target_name = target;
    this.comm_id = id;
    this._onMsg = null;
    this._onClose = null;
  }

  open(data, callbacks, metadata) {
    return this.bridge.open(this, data, metadata);
  }

  send(data, callbacks, metadata, buffers) {
    return this.bridge.send(this, data, callbacks, buffers);
  }

  close() {
    this.bridge.close(this);
    return '';
  }

  on_msg(callback) {
    this._onMsg = callback;
  }

  on_close(callback) {
    this._onClose = callback;
  }

  handle(msg) {
    const callback = msg.header.msg_type === 'comm_close' ? this._onClose : this._onMsg;
    return callback ? callback(msg) : undefined;
  }
}

class FrameManager extends HTMLManager {
  constructor(bridge) {
    super();
    this.bridge = bridge;
  }

  // the standard controls only: nothing is ever loaded from anywhere
  loadClass(className, moduleName) {
    const module = MODULES[moduleName];
    return module && module[className] ? Promise.resolve(module[className]) : Promise.reject(new Error(`kernel-sandbox: widget module ${moduleName} is not loaded in an output frame`));
  }

  _create_comm(target, id, data, metadata) {
    const comm = this.bridge.comm(target, id);
    if (data !== undefined && target === CONTROL) {
      comm.open(data, undefined, metadata);
    }
    return Promise.resolve(comm);
  }

  _get_comm_info() {
    return this.bridge.commInfo();
  }

  // The kernel's widget states, asked on a control comm. ipywidgets' own load gives up after 4 s and asks each comm
  // instead, whose answers carry no model names past the launcher's policy; but a kernel busy running a cell answers
  // late, not never, so the frame waits for it (a kernel without the control comm's target closes it at once).
  async load() {
    const control = await this._create_comm(CONTROL, base.uuid(), {}, { version: CONTROL_VERSION });
    let reply;
    try {
      reply = await new Promise((resolve, reject) => {
        control.on_msg(msg => msg.content.data.method === 'update_states' && resolve(msg));
        control.on_close(() => reject(new Error('the kernel closed the control comm')));
        control.send({ method: 'request_states' }, {});
      });
    } catch {
      return this._loadFromKernelModels();
    }
    control.close();
    const { states, buffer_paths: paths } = reply.content.data;
    (paths || []).forEach(([id, ...path], i) => states[id] && base.put_buffers(states[id], [path], [reply.buffers[i]]));
    const ids = Object.keys(states).filter(id => !this.has_model(id));
    const comms = await Promise.all(ids.map(id => this._create_comm(this.comm_target_name, id)));
    await this._newModels(ids.map((id, i) => ({ ...states[id], comm: comms[i] })));
  }

  // Models made of {comm, state, model_name, model_module, model_module_version}, all registered before any is made
  // (a widget's state names its layout and style models by id); one that fails leaves the others
  _newModels(models) {
    return Promise.all(
      models.map(({ comm, state, model_name, model_module, model_module_version }) =>
        this.new_model({ model_name, model_module, model_module_version, comm }, state).catch(error => console.error(error))
      )
    );
  }

  // ipywidgets < 7.7, or a control comm that did not answer in time (a busy kernel): each model's state is asked
  // on its comm. Upstream waits for every answer, and an answer the launcher's policy drops (a refused widget's
  // state) would hold every widget of the frame forever: an answer not come in ANSWER_MS is given up.
  async _loadFromKernelModels() {
    this.bridge.live();
    const ids = Object.keys(await this._get_comm_info()).filter(id => !this.has_model(id));
    const answers = (await Promise.all(ids.map(id => this._askState(id)))).filter(Boolean);
    await this._newModels(
      answers.map(({ comm, state }) => ({
        comm,
        state,
        model_name: state._model_name,
        model_module: state._model_module,
        model_module_version: state._model_module_version
      }))
    );
  }

  // The state the kernel sends on widget comm `id` in answer to request_state, or null after ANSWER_MS
  async _askState(id) {
    const comm = await this._create_comm(this.comm_target_name, id);
    return new Promise(resolve => {
      let msgId = '';
      const timer = setTimeout(() => resolve(null), ANSWER_MS);
      comm.on_msg(msg => {
        const data = msg.content.data;
        if (msg.parent_header.msg_id === msgId && msg.header.msg_type === 'comm_msg' && data.method === 'update') {
          clearTimeout(timer);
          base.put_buffers(data.state, data.buffer_paths || [], msg.buffers || []);
          resolve({ comm, state: data.state });
        }
      });
      msgId = comm.send({ method: 'request_state' }, this.callbacks(undefined));
    });
  }
}

self.kernelSandboxWidgets = bridge => new FrameManager(bridge);
self.kernelSandboxWidgetComm = Comm;
