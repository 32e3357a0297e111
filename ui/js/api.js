// The API client: the token, authorized fetches, problem+json errors and
// paginated lists.
//
// The token lives in sessionStorage only (gone when the tab closes) and goes
// out as `Authorization: Bearer` on every call. A 401 means the token is no
// good: the handler set with onUnauthorized() signs out.

const TOKEN_KEY = 'drover.token';
const NAMESPACE_KEY = 'drover.namespace';
const MAX_PAGES = 20;

// The paths whose objects belong to a namespace: every call to one names
// the picked namespace (the server's list: NAMESPACED in src/http/openapi.rs).
const NAMESPACED = ['/v1/pools', '/v1/clusters', '/v1/upgrades', '/v1/apply', '/v1/audit'];

// Where the API is: the page's own origin, unless the page names another in
// <meta name="drover-api" content="https://drover.example.com"> (the
// dashboard's files served from another origin, which drover then lists in
// --cors-allowed-origins; docs/dashboard.md).
const API_BASE = (document.querySelector('meta[name="drover-api"]')?.content || '').replace(/\/+$/, '');

export const token = () => sessionStorage.getItem(TOKEN_KEY);
export const setToken = (value) => sessionStorage.setItem(TOKEN_KEY, value);
export const forgetToken = () => {
  sessionStorage.removeItem(TOKEN_KEY);
  sessionStorage.removeItem(NAMESPACE_KEY);
};

// The namespace the views work in (the picker's); `default` until picked.
export const namespace = () => sessionStorage.getItem(NAMESPACE_KEY) || 'default';
export const setNamespace = (value) => sessionStorage.setItem(NAMESPACE_KEY, value);

// `path` naming the picked namespace, when the path takes one and does not
// name one already.
export function inNamespace(path) {
  const bare = path.split('?')[0];
  const namespaced = NAMESPACED.some((p) => bare === p || bare.startsWith(`${p}/`));
  if (!namespaced || /[?&]namespace=/.test(path)) return path;
  const sep = path.includes('?') ? '&' : '?';
  return `${path}${sep}namespace=${encodeURIComponent(namespace())}`;
}

let unauthorized = () => {};
// Set by the router; a callback rather than an import keeps this module
// free of the views.
export function onUnauthorized(handler) {
  unauthorized = handler;
}

export class Problem extends Error {
  constructor(status, title, detail) {
    super(detail ? `${title}: ${detail}` : title);
    this.status = status;
    this.title = title;
    this.detail = detail || '';
  }
}

async function problemOf(res) {
  const type = res.headers.get('content-type') || '';
  if (type.includes('json')) {
    try {
      const body = await res.json();
      return new Problem(res.status, body.title || `HTTP ${res.status}`, body.detail || '');
    } catch (_) { /* fall through to the status line */ }
  }
  return new Problem(res.status, `HTTP ${res.status}`, res.statusText || '');
}

// fetch() with the token. Answers the response, whatever its status, except
// a 401, which signs out and throws.
export async function authorizedFetch(path, init = {}) {
  const t = token();
  if (!t) {
    unauthorized('Please sign in.');
    throw new Problem(401, 'Not signed in', '');
  }
  const headers = { ...(init.headers || {}), Authorization: `Bearer ${t}` };
  const res = await fetch(API_BASE + inNamespace(path), { cache: 'no-store', ...init, headers });
  if (res.status === 401) {
    const p = await problemOf(res);
    unauthorized(`The server did not accept the token (${p.title}). Sign in again.`);
    throw p;
  }
  return res;
}

// Calls the API; throws a Problem on any non-2xx answer.
export async function api(method, path, { body, contentType, signal } = {}) {
  const headers = { Accept: 'application/json, application/problem+json' };
  const init = { method, headers, signal };
  if (body !== undefined) {
    headers['Content-Type'] = contentType || 'application/json';
    init.body = JSON.stringify(body);
  }
  const res = await authorizedFetch(path, init);
  if (!res.ok) throw await problemOf(res);
  if (res.status === 204) return null;
  return res.json();
}

export const get = (path, signal) => api('GET', path, { signal });

// All items of a paginated list, up to MAX_PAGES pages.
export async function listAll(path, signal) {
  const items = [];
  let cursor = null;
  for (let page = 0; page < MAX_PAGES; page++) {
    const sep = path.includes('?') ? '&' : '?';
    const url = cursor ? `${path}${sep}cursor=${encodeURIComponent(cursor)}` : path;
    const body = await get(url, signal);
    items.push(...(body.items || []));
    cursor = body.next_cursor;
    if (!cursor) break;
  }
  return items;
}
