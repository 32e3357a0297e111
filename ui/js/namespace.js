// The namespace picker in the top bar: which namespace the views work in.
// Its list is the namespaces the token holds a role in (GET /v1/namespaces);
// the choice lives in the tab's session storage with the token, and every
// call to a namespaced path names it (api.js, inNamespace).

import { get, namespace, setNamespace } from './api.js';
import { $, el } from './dom.js';

// Fills the picker; keeps the namespace picked before if the token still
// sees it, else `default`, else the first one. Answers the names.
export async function loadNamespaces() {
  const body = await get('/v1/namespaces');
  const names = (body.items || []).map((n) => n.name);
  if (!names.includes(namespace())) {
    setNamespace(names.includes('default') ? 'default' : (names[0] || 'default'));
  }
  const picker = $('namespace-picker');
  picker.replaceChildren(...names.map((name) => el('option', { value: name, text: name })));
  picker.value = namespace();
  picker.disabled = names.length < 2;
  return names;
}

// `onChange` runs after another namespace was picked (it reopens the views).
export function wireNamespacePicker(onChange) {
  $('namespace-picker').addEventListener('change', (ev) => {
    setNamespace(ev.target.value);
    onChange();
  });
}
