// WidgetStates: the page keeps each widget's state as the messages that passed the policy left it, and gives a
// frame the request_states answer ipywidgets would. The messages come from the kernel (the attacker's code), so
// shapes that would reach a prototype or shift buffers onto other fields are dropped.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { WidgetStates } from '../src/states.js';

const NAMES = { _model_name: 'IntSliderModel', _model_module: '@jupyter-widgets/controls', _model_module_version: '2.0.0' };
const bytes = text => new TextEncoder().encode(text);

test('an opened widget and its updates make the state ipywidgets would answer', () => {
  const states = new WidgetStates();
  states.open('a', { state: { ...NAMES, value: 1, description: 'x' }, buffer_paths: [] }, []);
  states.update('a', { method: 'update', state: { value: 7 }, buffer_paths: [] }, []);
  states.update('a', { method: 'echo_update', state: { description: 'y' }, buffer_paths: [] }, []);
  const { data, buffers } = states.snapshot();
  assert.deepEqual(data, {
    method: 'update_states',
    states: {
      a: { model_name: 'IntSliderModel', model_module: '@jupyter-widgets/controls', model_module_version: '2.0.0', state: { ...NAMES, value: 7, description: 'y' } }
    },
    buffer_paths: []
  });
  assert.deepEqual(buffers, []);
});

test('buffers follow their field: an update of the field replaces them, a closed widget leaves', () => {
  const states = new WidgetStates();
  const upload = { ...NAMES, _model_name: 'FileUploadModel', value: [{ name: 'a.txt' }] };
  states.open('u', { state: upload, buffer_paths: [['value', 0, 'content']] }, [bytes('first')]);
  states.open('i', { state: { ...NAMES, _model_name: 'ImageModel' }, buffer_paths: [['value']] }, [bytes('png')]);
  let snap = states.snapshot();
  assert.deepEqual(snap.data.buffer_paths, [['u', 'state', 'value', 0, 'content'], ['i', 'state', 'value']]);
  assert.deepEqual(snap.buffers, [bytes('first'), bytes('png')]);
  states.update('u', { method: 'update', state: { value: [{ name: 'b.txt' }, { name: 'c.txt' }] }, buffer_paths: [['value', 1, 'content']] }, [bytes('second')]);
  states.update('i', { method: 'update', state: { width: '10' }, buffer_paths: [] }, []);
  states.close('gone');
  snap = states.snapshot();
  assert.deepEqual(snap.data.buffer_paths, [['u', 'state', 'value', 1, 'content'], ['i', 'state', 'value']]);
  assert.deepEqual(snap.buffers, [bytes('second'), bytes('png')]);
  assert.deepEqual(snap.data.states.u.state.value, [{ name: 'b.txt' }, { name: 'c.txt' }]);
  states.close('u');
  assert.deepEqual(Object.keys(states.snapshot().data.states), ['i']);
});

test('hostile shapes reach no prototype and shift no buffer', () => {
  const states = new WidgetStates();
  states.open('a', { state: { ...NAMES, value: 1 }, buffer_paths: [] }, []);
  // a buffer path through __proto__, and more paths than buffers: the buffers are dropped, the keys stay data
  states.update('a', { method: 'update', state: { value: 2 }, buffer_paths: [['__proto__', 'polluted']] }, [bytes('x')]);
  states.update('a', { method: 'update', state: {}, buffer_paths: [['value'], ['description']] }, [bytes('y')]);
  states.update('a', JSON.parse('{"method": "update", "state": {"__proto__": {"polluted": 1}}}'), []);
  assert.equal({}.polluted, undefined);
  assert.deepEqual(states.snapshot().data.states.a.state, { ...NAMES, value: 2 });
  assert.deepEqual(states.snapshot().buffers, []);
  // a widget without its model's names, an update of a widget never opened, a state that is no object: nothing
  states.open('b', { state: { value: 1 } }, []);
  states.update('c', { method: 'update', state: { value: 1 } }, []);
  states.open('d', { state: 'x' }, []);
  assert.deepEqual(Object.keys(states.snapshot().data.states), ['a']);
});

test('the kernel\'s own answer replaces the states and makes them complete; a restart empties them', () => {
  const states = new WidgetStates();
  assert.equal(states.complete, false);
  states.open('old', { state: { ...NAMES }, buffer_paths: [] }, []);
  states.replace(
    {
      method: 'update_states',
      states: {
        s: { model_name: 'ImageModel', model_module: '@jupyter-widgets/controls', model_module_version: '2.0.0', state: { width: '5' } },
        bad: { model_name: 1, state: {} }
      },
      buffer_paths: [['s', 'state', 'value']]
    },
    [bytes('img')]
  );
  assert.equal(states.complete, true);
  const snap = states.snapshot();
  assert.deepEqual(Object.keys(snap.data.states), ['s']);
  assert.deepEqual(snap.data.buffer_paths, [['s', 'state', 'value']]);
  states.clear();
  assert.deepEqual(states.snapshot().data.states, {});
  assert.equal(states.complete, true);
});

test('a listing of the kernel\'s widget comms makes the states complete only when it names none they lack', () => {
  const states = new WidgetStates();
  states.open('a', { state: { ...NAMES }, buffer_paths: [] }, []);
  states.listed(['a', 'b']);
  assert.equal(states.complete, false);
  states.listed(['a']);
  assert.equal(states.complete, true);
});
