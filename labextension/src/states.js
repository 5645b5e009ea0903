// The widget states of one sandboxed kernel as the page's relay has seen them pass (comm_open, update and
// echo_update, comm_close: each already through the launcher's policy), so that a frame drawing a widget gets its
// states at once, as a local kernel's widgets are drawn at once, instead of asking a kernel that may be busy running
// the very cell that shows them (a progress bar would then move only when its loop is over).
//
// A record is the state of a widget with its binary buffers kept apart, by path, as ipywidgets sends them.
// `complete` says whether the records hold every widget the kernel has: a fresh kernel's listing of its widget comms
// (`listed`) names none they lack; after a page reload only the kernel's own answer to request_states (`replace`) does.

const NAME_KEYS = ['model_name', 'model_module', 'model_module_version'];

export class WidgetStates {
  constructor() {
    this.records = new Map(); // comm_id -> {names, state, buffers: [{path, buffer}]}
    this.complete = false;
  }

  // A widget comm the kernel opened: data.state holds its model's names (_model_name...) with the rest
  open(id, data, buffers) {
    if (!isPlainObject(data) || !isPlainObject(data.state)) {
      return;
    }
    const state = data.state;
    const names = {
      model_name: state._model_name,
      model_module: state._model_module,
      model_module_version: state._model_module_version
    };
    if (!NAME_KEYS.every(key => typeof names[key] === 'string')) {
      return;
    }
    this.records.set(id, { names, state: {}, buffers: [] });
    this.update(id, data, buffers);
  }

  // An update (or echo_update) of widget `id`: each key it names replaces the key's value and buffers
  update(id, data, buffers) {
    const record = this.records.get(id);
    if (!record || !isPlainObject(data) || !isPlainObject(data.state)) {
      return;
    }
    const paths = validPaths(data.buffer_paths, buffers);
    const keys = new Set([...Object.keys(data.state), ...paths.map(path => String(path[0]))]);
    for (const key of keys) {
      if (key === '__proto__') {
        continue;
      }
      if (Object.prototype.hasOwnProperty.call(data.state, key)) {
        record.state[key] = data.state[key];
      } else {
        delete record.state[key];
      }
    }
    record.buffers = record.buffers.filter(kept => !keys.has(String(kept.path[0])));
    paths.forEach((path, i) => record.buffers.push({ path, buffer: buffers[i] }));
  }

  close(id) {
    this.records.delete(id);
  }

  // The kernel's listing of its widget comms: the records are complete when it names none they lack
  listed(ids) {
    if (ids.every(id => this.records.has(id))) {
      this.complete = true;
    }
  }

  // The kernel's answer to request_states: every widget it has, as it was when it answered
  replace(data, buffers) {
    if (!isPlainObject(data) || !isPlainObject(data.states)) {
      return;
    }
    const paths = validPaths(data.buffer_paths, buffers);
    this.records.clear();
    for (const [id, entry] of Object.entries(data.states)) {
      if (!isPlainObject(entry) || !isPlainObject(entry.state) || !NAME_KEYS.every(key => typeof entry[key] === 'string')) {
        continue;
      }
      const names = { model_name: entry.model_name, model_module: entry.model_module, model_module_version: entry.model_module_version };
      const own = [];
      paths.forEach((path, i) => {
        if (path[0] === id && path[1] === 'state' && path.length > 2) {
          own.push({ path: path.slice(2), buffer: buffers[i] });
        }
      });
      this.records.set(id, { names, state: { ...entry.state }, buffers: own });
    }
    this.complete = true;
  }

  clear() {
    this.records.clear();
    this.complete = true; // a restarted kernel has no widget
  }

  // The request_states answer ipywidgets would send: {method, states, buffer_paths} and its buffers
  snapshot() {
    const states = {};
    const bufferPaths = [];
    const buffers = [];
    for (const [id, record] of this.records) {
      states[id] = { ...record.names, state: { ...record.state } };
      for (const { path, buffer } of record.buffers) {
        bufferPaths.push([id, 'state', ...path]);
        buffers.push(buffer);
      }
    }
    return { data: { method: 'update_states', states, buffer_paths: bufferPaths }, buffers };
  }
}

// The buffer paths of a message that has one buffer for each, every path a non-empty list of keys and indices
function validPaths(paths, buffers) {
  if (!Array.isArray(paths) || !Array.isArray(buffers) || paths.length !== buffers.length) {
    return [];
  }
  const valid = paths.every(
    path => Array.isArray(path) && path.length > 0 && path.every(part => (typeof part === 'string' && part !== '__proto__') || Number.isInteger(part))
  );
  return valid ? paths : [];
}

export function isPlainObject(value) {
  return value !== null && typeof value === 'object' && Object.getPrototypeOf(value) === Object.prototype;
}

// A buffer as a frame takes it: an ArrayBuffer of its own bytes (a message's buffers may be views)
export function arrayBuffer(b) {
  return b instanceof ArrayBuffer ? b : b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength);
}
