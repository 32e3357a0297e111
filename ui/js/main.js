// drover dashboard: a small hash-routed page over the /v1 API. This module
// wires the page's forms and buttons and opens the first view; see
// docs/dashboard.md for what each module owns.

import { onUnauthorized, setToken, token } from './api.js';
import { $ } from './dom.js';
import { clearProblem, showProblem } from './feedback.js';
import { loadNamespaces, wireNamespacePicker } from './namespace.js';
import { route, signOut } from './router.js';
import { wirePoolControls } from './views/pool.js';

function wireLogin() {
  $('login-form').addEventListener('submit', async (ev) => {
    ev.preventDefault();
    const value = $('token').value.trim();
    if (!value) return;
    setToken(value);
    $('login-error').hidden = true;
    try {
      // Check the token before showing anything (a 401 signs out again),
      // and learn the namespaces it holds a role in.
      await loadNamespaces();
    } catch (err) {
      showProblem(err);
      if (!token()) return;
    }
    $('token').value = '';
    if (!location.hash || location.hash === '#') location.hash = '#/pools'; // hashchange routes
    else route();
  });
  $('logout').addEventListener('click', () => signOut('Signed out.'));
}

onUnauthorized(signOut);
wireLogin();
wirePoolControls();
// Another namespace: back to its pools (a pool or job open now is the old
// namespace's).
wireNamespacePicker(() => {
  if (location.hash === '#/pools') route();
  else location.hash = '#/pools';
});
$('problem-dismiss').addEventListener('click', clearProblem);
window.addEventListener('hashchange', route);
// A tab reloaded while signed in: the picker again, then the view.
if (token()) loadNamespaces().catch(showProblem);
route();
