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

  load() {
    return this._loadFromKernel();
  }

  // ipywidgets < 7.7, or a control comm that did not answer in time: each model's state is asked on its comm
  _loadFromKernelModels() {
    this.bridge.live();
    return super._loadFromKernelModels();
  }
}

self.kernelSandboxWidgets = bridge => new FrameManager(bridge);
self.kernelSandboxWidgetComm = Comm;
