// DOM helpers. Everything is built with textContent and attributes, never
// innerHTML, so that names and messages from the API cannot inject markup.

export const $ = (id) => document.getElementById(id);

// el('td', { class: 'x', text: 'hi', 'data-testid': 'y' }, ...children).
// An attribute that is undefined, null or false is left out.
export function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'class') node.className = v;
    else if (k === 'text') node.textContent = v;
    else node.setAttribute(k, v === true ? '' : String(v));
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

// Replaces the children of `node` only when `key` changed, so that a
// refresh every second does not steal focus or flicker.
export function renderInto(node, key, build) {
  if (node.dataset.key === key) return;
  node.dataset.key = key;
  node.replaceChildren(...build());
}

// Empties nodes and forgets their keys, for a view opened afresh.
export function reset(...ids) {
  for (const id of ids) {
    $(id).replaceChildren();
    delete $(id).dataset.key;
  }
}

// A <dl> of [term, value] pairs; a missing value shows as a dash.
export function summary(node, pairs) {
  renderInto(node, JSON.stringify(pairs), () =>
    pairs.flatMap(([k, v]) => [el('dt', { text: k }), el('dd', { text: v ?? '—' })]));
}

export const fmtTime = (s) => (s ? new Date(s).toLocaleString() : '—');
export const fmtShortTime = (s) => (s ? new Date(s).toLocaleTimeString() : '');

// "12 s ago", "3 min ago", "2 h ago": how long since `s`.
export function fmtAgo(s) {
  if (!s) return '—';
  const secs = Math.max(0, Math.round((Date.now() - new Date(s).getTime()) / 1000));
  if (secs < 90) return `${secs} s ago`;
  if (secs < 90 * 60) return `${Math.round(secs / 60)} min ago`;
  return `${Math.round(secs / 3600)} h ago`;
}

export const plural = (n, one, many = `${one}s`) => `${n} ${n === 1 ? one : many}`;

export const sleep = (ms, signal) => new Promise((resolve) => {
  const t = setTimeout(resolve, ms);
  if (signal) signal.addEventListener('abort', () => { clearTimeout(t); resolve(); }, { once: true });
});

// A table: headings, then rows of cells (a string, or a node).
export function table(headings, rows, rowAttrs = () => ({})) {
  return el('table', {},
    el('thead', {}, el('tr', {}, ...headings.map((h) => el('th', { scope: 'col', text: h })))),
    el('tbody', {}, ...rows.map((cells, i) => el('tr', rowAttrs(i),
      ...cells.map((c) => (c instanceof Node ? el('td', {}, c) : el('td', { text: c ?? '' })))))));
}
