// Hash routing: which view is open, starting and stopping it, and signing
// out. Each view is { id, nav, title(params), run(params, signal) }: `id`
// is its <section>, `nav` the top-bar link it belongs to, and `run` keeps
// it fresh until `signal` aborts.

import { forgetToken, token } from './api.js';
import { $ } from './dom.js';
import { clearProblem, hideNotice, setLiveMode, showProblem } from './feedback.js';
import { enginesView } from './views/engines.js';
import { poolView } from './views/pool.js';
import { poolsView } from './views/pools.js';
import { upgradeView, upgradesView } from './views/upgrades.js';

// [first part of the hash, whether it takes a name, view]; the first that
// matches wins, and anything else opens the pools.
const ROUTES = [
  ['pools', true, poolView],
  ['upgrades', true, upgradeView],
  ['upgrades', false, upgradesView],
  ['engines', false, enginesView],
];
const VIEWS = [poolsView, poolView, upgradesView, upgradeView, enginesView];
const NAV = ['nav-pools', 'nav-upgrades', 'nav-engines'];

let running = null; // the AbortController of the open view

// Shows one section (a view's, or 'login') and marks its top-bar link.
function show(id, nav) {
  $('login').hidden = id !== 'login';
  for (const v of VIEWS) $(v.id).hidden = v.id !== id;
  const signedIn = id !== 'login';
  $('nav').hidden = !signedIn;
  $('logout').hidden = !signedIn;
  for (const link of NAV) {
    if (link === nav) $(link).setAttribute('aria-current', 'page');
    else $(link).removeAttribute('aria-current');
  }
}

function stopView() {
  if (running) running.abort();
  running = null;
  setLiveMode('');
}

function match(hash) {
  const parts = hash.replace(/^#\/?/, '').split('/').filter(Boolean).map(decodeURIComponent);
  const named = parts.length > 1;
  const found = ROUTES.find(([head, takesName]) => head === parts[0] && takesName === named);
  return found ? [found[2], parts.slice(1)] : [poolsView, []];
}

export function route() {
  stopView();
  if (!token()) {
    show('login');
    $('token').focus();
    return;
  }
  clearProblem();
  const [view, params] = match(location.hash);
  show(view.id, view.nav);
  document.title = `${view.title(params)} · drover`;
  const ctl = new AbortController();
  running = ctl;
  view.run(params, ctl.signal).catch(showProblem);
}

export function signOut(message) {
  forgetToken();
  stopView();
  clearProblem();
  hideNotice();
  const err = $('login-error');
  err.textContent = message || '';
  err.hidden = !message;
  show('login');
  $('token').value = '';
  $('token').focus();
}
