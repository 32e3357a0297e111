// drover dashboard: a small hash-routed page over the /v1 API.
//
// The token lives in sessionStorage only (gone when the tab closes) and goes
// out as `Authorization: Bearer` on every call. Live views read the SSE
// stream with fetch() (EventSource cannot send that header) and fall back to
// polling once a second when there is no stream.
'use strict';

(() => {
  const TOKEN_KEY = 'drover.token';
  const POLL_MS = 1000;
  const LIST_POLL_MS = 2000;
  const MAX_PAGES = 20;

  const $ = (id) => document.getElementById(id);

  // ---------------------------------------------------------------- API --

  class Problem extends Error {
    constructor(status, title, detail) {
      super(detail ? `${title}: ${detail}` : title);
      this.status = status;
      this.title = title;
      this.detail = detail || '';
    }
  }

  const token = () => sessionStorage.getItem(TOKEN_KEY);

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

  // Calls the API; throws a Problem on any non-2xx answer. A 401 also
  // signs out, since the token is no good.
  async function api(method, path, body, contentType, signal) {
    const t = token();
    if (!t) {
      signOut('Please sign in.');
      throw new Problem(401, 'Not signed in', '');
    }
    const headers = { Authorization: `Bearer ${t}`, Accept: 'application/json, application/problem+json' };
    const init = { method, headers, cache: 'no-store', signal };
    if (body !== undefined) {
      headers['Content-Type'] = contentType || 'application/json';
      init.body = JSON.stringify(body);
    }
    const res = await fetch(path, init);
    if (res.status === 401) {
      const p = await problemOf(res);
      signOut(`The server did not accept the token (${p.title}). Sign in again.`);
      throw p;
    }
    if (!res.ok) throw await problemOf(res);
    if (res.status === 204) return null;
    return res.json();
  }

  // All items of a paginated list, up to MAX_PAGES pages.
  async function listAll(path, signal) {
    const items = [];
    let cursor = null;
    for (let page = 0; page < MAX_PAGES; page++) {
      const sep = path.includes('?') ? '&' : '?';
      const url = cursor ? `${path}${sep}cursor=${encodeURIComponent(cursor)}` : path;
      const body = await api('GET', url, undefined, undefined, signal);
      items.push(...(body.items || []));
      cursor = body.next_cursor;
      if (!cursor) break;
    }
    return items;
  }

  // ------------------------------------------------------- DOM helpers --

  function el(tag, attrs, ...children) {
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
  function renderInto(node, key, build) {
    if (node.dataset.key === key) return;
    node.dataset.key = key;
    node.replaceChildren(...build());
  }

  function summary(node, pairs) {
    renderInto(node, JSON.stringify(pairs), () =>
      pairs.flatMap(([k, v]) => [el('dt', { text: k }), el('dd', { text: v === null || v === undefined ? '—' : v })]));
  }

  const fmtTime = (s) => (s ? new Date(s).toLocaleString() : '—');
  const fmtShortTime = (s) => (s ? new Date(s).toLocaleTimeString() : '');

  function showProblem(err) {
    if (!err || err.name === 'AbortError') return;
    if (err.status === 401) return; // signOut already said so
    const title = err instanceof Problem ? err.title : 'Could not reach drover';
    const detail = err instanceof Problem ? err.detail : String(err.message || err);
    $('problem-title').textContent = title;
    $('problem-detail').textContent = detail;
    $('problem').hidden = false;
  }

  function clearProblem() {
    $('problem').hidden = true;
  }

  let noticeTimer = null;
  function notice(text) {
    $('notice').textContent = text;
    $('notice').hidden = false;
    clearTimeout(noticeTimer);
    noticeTimer = setTimeout(() => { $('notice').hidden = true; }, 4000);
  }

  const sleep = (ms, signal) => new Promise((resolve) => {
    const t = setTimeout(resolve, ms);
    if (signal) signal.addEventListener('abort', () => { clearTimeout(t); resolve(); }, { once: true });
  });

  function setLiveMode(text) {
    const node = $('live-mode');
    node.textContent = text;
    node.hidden = !text;
  }

  // ------------------------------------------------------- live updates --

  // Parses a text/event-stream body, calling onEvent(name, data) per event.
  async function readSse(body, onEvent) {
    const reader = body.getReader();
    const decoder = new TextDecoder();
    let buffer = '';
    let name = '';
    let data = [];
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += decoder.decode(value, { stream: true });
      // A trailing \r may be the first half of \r\n: keep it for the next chunk.
      const cut = buffer.endsWith('\r') ? buffer.length - 1 : buffer.length;
      const lines = buffer.slice(0, cut).split(/\r\n|\r|\n/);
      buffer = lines.pop() + buffer.slice(cut);
      for (const line of lines) {
        if (line === '') {
          if (data.length) onEvent(name || 'message', data.join('\n'));
          name = '';
          data = [];
        } else if (line.startsWith(':')) {
          // a comment: keep-alive
        } else {
          const i = line.indexOf(':');
          const field = i < 0 ? line : line.slice(0, i);
          let val = i < 0 ? '' : line.slice(i + 1);
          if (val.startsWith(' ')) val = val.slice(1);
          if (field === 'event') name = val;
          else if (field === 'data') data.push(val);
        }
      }
    }
  }

  // One attempt at the SSE stream: 'missing' when the server has none,
  // 'ended' or 'failed' when it stopped or never started, 'signed-out' on 401.
  async function stream(path, refresh, handlers, signal) {
    let res;
    try {
      res = await fetch(path, {
        headers: { Authorization: `Bearer ${token()}`, Accept: 'text/event-stream' },
        cache: 'no-store',
        signal,
      });
    } catch (_) {
      return 'failed';
    }
    if (res.status === 401) {
      signOut('The server did not accept the token. Sign in again.');
      return 'signed-out';
    }
    const type = res.headers.get('content-type') || '';
    if (!res.ok || !res.body || !type.startsWith('text/event-stream')) {
      if (res.body) res.body.cancel().catch(() => {});
      return [404, 405, 501].includes(res.status) || res.ok ? 'missing' : 'failed';
    }
    setLiveMode('Live (stream)');
    // Events come in bursts; one refresh of the rest of the view per burst.
    let pending = null;
    const soon = () => {
      if (!pending) pending = setTimeout(() => { pending = null; if (!signal.aborted) refresh().catch(showProblem); }, 200);
    };
    try {
      await readSse(res.body, (name, data) => {
        let value = null;
        try { value = JSON.parse(data); } catch (_) { /* not JSON: handlers get null */ }
        const handler = handlers[name];
        if (handler) handler(value);
        if (name !== 'deleted') soon();
      });
      return 'ended';
    } catch (_) {
      return 'failed';
    }
  }

  // Keeps a view fresh until `signal` aborts: follows the stream while it
  // works; without one, polls every POLL_MS; when it breaks, polls a few
  // times and tries the stream again.
  async function watch(streamPath, refresh, handlers, signal) {
    await refresh().catch(showProblem);
    while (!signal.aborted) {
      const result = await stream(streamPath, refresh, handlers, signal);
      if (result === 'signed-out' || signal.aborted) return;
      const missing = result === 'missing';
      setLiveMode(missing ? 'Live (polling every second)' : 'Live (polling; reconnecting to the stream)');
      for (let i = 0; (missing || i < 5) && !signal.aborted; i++) {
        await sleep(POLL_MS, signal);
        if (!signal.aborted) await refresh().catch(showProblem);
      }
    }
  }

  // A list view's loop: refresh every LIST_POLL_MS.
  async function poll(refresh, signal) {
    setLiveMode('Live (polling)');
    while (!signal.aborted) {
      await refresh().catch(showProblem);
      await sleep(LIST_POLL_MS, signal);
    }
  }

  // -------------------------------------------------------------- views --

  const VIEWS = ['login', 'view-pools', 'view-pool', 'view-upgrades', 'view-upgrade'];
  function show(id) {
    for (const v of VIEWS) $(v).hidden = v !== id;
    const signedIn = id !== 'login';
    $('nav').hidden = !signedIn;
    $('logout').hidden = !signedIn;
    const mark = (link, on) => (on ? link.setAttribute('aria-current', 'page') : link.removeAttribute('aria-current'));
    mark($('nav-pools'), id === 'view-pools' || id === 'view-pool');
    mark($('nav-upgrades'), id === 'view-upgrades' || id === 'view-upgrade');
  }

  // Rollout state as the list can tell it from the pool alone.
  function rolloutState(pool) {
    const r = pool.status && pool.status.rollout;
    if (pool.paused) return 'paused';
    if (!r) return '—';
    if (r.rolling_back) return 'rolling back';
    if (r.deadline_exceeded) return 'stalled';
    if (r.completed_at) return 'complete';
    return 'progressing';
  }

  async function poolsView(signal) {
    show('view-pools');
    document.title = 'Pools · drover';
    await poll(async () => {
      const pools = await listAll('/v1/pools?limit=500', signal);
      if (signal.aborted) return;
      clearProblemIfOk();
      $('pools-empty').hidden = pools.length > 0;
      const rows = pools.map((p) => [p.name, p.replicas, p.status.ready_replicas, p.status.updated_replicas,
        p.phase, rolloutState(p)]);
      renderInto($('pools-body'), JSON.stringify(rows), () => rows.map((r) => el('tr', { 'data-testid': 'pool-row', 'data-pool': r[0] },
        el('td', {}, el('a', { href: `#/pools/${encodeURIComponent(r[0])}`, 'data-testid': 'pool-link', text: r[0] })),
        ...r.slice(1).map((v) => el('td', { text: v })))));
    }, signal);
  }

  // What a machine cell shows: one of the legend's states.
  function machineState(m) {
    if (m.phase === 'deleting' || m.delete_requested) return ['deleting', '−'];
    if (m.phase === 'failed') return ['failed', '✕'];
    if (m.phase === 'provisioning') return ['provisioning', '…'];
    if (m.ready) return ['ready', '✓'];
    return ['starting', '○'];
  }

  const imageTag = (i) => String.fromCharCode(65 + (i % 26)) + (i >= 26 ? String(Math.floor(i / 26)) : '');

  function renderMachines(pool, machines) {
    // Desired image first, then the others by name, so letters stay put.
    const images = [...new Set(machines.map((m) => m.image))].filter((i) => i !== pool.desired_image).sort();
    images.unshift(pool.desired_image);
    const index = new Map(images.map((img, i) => [img, i]));
    const cells = machines.map((m) => {
      const [state, glyph] = machineState(m);
      return { name: m.name, image: m.image, state, glyph, i: index.get(m.image) };
    });
    $('machine-count').textContent = `(${machines.length})`;
    renderInto($('machine-grid'), JSON.stringify(cells), () => cells.map((c) => el('li', {
      class: `cell st-${c.state} img-${c.i % 8}`,
      'data-testid': 'machine-cell',
      'data-machine': c.name,
      'data-state': c.state,
      'data-image': c.image,
      title: `${c.name}: ${c.state}, image ${c.image}`,
      'aria-label': `${c.name}: ${c.state}, image ${imageTag(c.i)} (${c.image})`,
    },
    el('span', { class: 'img-tag', 'aria-hidden': 'true', text: imageTag(c.i) }),
    el('span', { class: 'mname', text: c.name }),
    el('span', { class: 'mstate' }, el('span', { class: 'glyph', 'aria-hidden': 'true', text: c.glyph }), c.state))));
    const legend = images.filter((img) => img === pool.desired_image || machines.some((m) => m.image === img));
    renderInto($('image-legend'), JSON.stringify(legend), () => legend.map((img) => {
      const i = index.get(img);
      return el('li', { 'data-testid': 'image-legend-item' },
        el('span', { class: `swatch img img-${i % 8}`, 'aria-hidden': 'true' }),
        el('strong', { text: imageTag(i) }),
        ` ${img}${img === pool.desired_image ? ' (desired)' : ''}`);
    }));
  }

  function renderRollout(r) {
    const bar = $('rollout-bar');
    const target = Math.max(r.replicas, 1);
    bar.max = target;
    bar.value = Math.min(r.counts.updated_available, target);
    const parts = [
      `State: ${r.state.replace('_', ' ')}${r.reason ? ` (${r.reason})` : ''}`,
      `${r.counts.updated_available} of ${r.replicas} updated and available`,
      `${r.counts.total} machines, ${r.counts.ready} ready, ${r.counts.outdated} outdated`,
      `${r.remaining} remaining`,
    ];
    if (r.estimated_seconds_remaining !== null && r.estimated_seconds_remaining !== undefined) {
      parts.push(`about ${Math.ceil(r.estimated_seconds_remaining)} s left`);
    }
    if (r.batch && r.batch.awaiting_approval) parts.push('waiting for batch approval');
    $('rollout-text').textContent = `${parts.join(' · ')}.`;
    $('rollout-text').dataset.state = r.state;
  }

  function renderEvents(node, events) {
    const rows = events.map((e) => [e.id, e.time, e.type, e.reason, e.message]);
    renderInto(node, JSON.stringify(rows), () => (rows.length ? rows : [null]).map((r) => (r
      ? el('li', { class: r[2] === 'Warning' ? 'warning' : '', 'data-testid': 'event' },
        el('time', { datetime: r[1], text: fmtShortTime(r[1]) }), el('span', { class: 'reason', text: r[3] }), r[4])
      : el('li', { class: 'muted', text: 'No events yet.' }))));
  }

  let okSince = 0;
  // A good refresh clears a stale error after a few seconds, not at once,
  // so that the answer to a button press stays readable.
  function clearProblemIfOk() {
    if (!$('problem').hidden && Date.now() - okSince > 5000) clearProblem();
  }

  async function poolView(name, signal) {
    show('view-pool');
    document.title = `${name} · drover`;
    $('pool-title').textContent = `Pool ${name}`;
    for (const id of ['pool-summary', 'machine-grid', 'image-legend', 'pool-events']) {
      $(id).replaceChildren();
      delete $(id).dataset.key;
    }
    $('rollout-text').textContent = '';
    const base = `/v1/pools/${encodeURIComponent(name)}`;
    let scaleSet = false;
    let pool = null;

    const renderPool = (p) => {
      pool = p;
      summary($('pool-summary'), [
        ['Replicas', `${p.replicas} desired, ${p.status.replicas} exist, ${p.status.ready_replicas} ready, ` +
          `${p.status.updated_replicas} updated`],
        ['Image', p.desired_image],
        ['Version', p.version],
        ['Phase', p.phase],
        ['Paused', p.paused ? 'yes' : 'no'],
        ['Generation', `${p.generation} (observed ${p.status.observed_generation ?? '—'})`],
        ['Last error', p.status.last_error || 'none'],
      ]);
      $('pause').disabled = p.paused;
      $('resume').disabled = !p.paused;
      if (!scaleSet && document.activeElement !== $('scale-input')) {
        $('scale-input').value = p.replicas;
        scaleSet = true;
      }
    };

    const refresh = async () => {
      const [p, machines, rollout, events] = await Promise.all([
        api('GET', base, undefined, undefined, signal),
        listAll(`${base}/machines?limit=500`, signal),
        api('GET', `${base}/rollout`, undefined, undefined, signal),
        api('GET', `${base}/events?limit=20`, undefined, undefined, signal),
      ]);
      if (signal.aborted) return;
      clearProblemIfOk();
      renderPool(p);
      renderMachines(p, machines);
      renderRollout(rollout);
      renderEvents($('pool-events'), events.items || []);
    };

    // Buttons and the form act on whichever pool is open.
    actions.scale = async (replicas) => {
      await api('PUT', `${base}/scale`, { replicas });
      notice(`Scaling ${name} to ${replicas}.`);
      scaleSet = false;
      await refresh();
    };
    actions.pause = async (paused) => {
      await api('PATCH', base, { paused }, 'application/merge-patch+json');
      notice(paused ? `Paused ${name}.` : `Resumed ${name}.`);
      await refresh();
    };

    await watch(`${base}/stream`, refresh, {
      status: (p) => { if (p && p.name === name && p.status) renderPool(p); },
      deleted: () => { notice(`Pool ${name} was deleted.`); location.hash = '#/pools'; },
    }, signal);
    return pool;
  }

  async function upgradesView(signal) {
    show('view-upgrades');
    document.title = 'Upgrades · drover';
    await poll(async () => {
      const jobs = await listAll('/v1/upgrades?limit=100', signal);
      if (signal.aborted) return;
      clearProblemIfOk();
      $('upgrades-empty').hidden = jobs.length > 0;
      const rows = jobs.map((j) => [j.id, j.cluster, `${j.from_version || '?'} → ${j.version}`, j.state,
        j.current ? `${j.current.component}: ${j.current.step_name}` : '—', fmtTime(j.created_at)]);
      renderInto($('upgrades-body'), JSON.stringify(rows), () => rows.map((r) => el('tr', { 'data-testid': 'upgrade-row' },
        el('td', {}, el('a', { href: `#/upgrades/${r[0]}`, 'data-testid': 'upgrade-link', text: `#${r[0]}` })),
        el('td', { text: r[1] }), el('td', { text: r[2] }), el('td', { class: `state-${r[3]}`, text: r[3] }),
        el('td', { text: r[4] }), el('td', { text: r[5] }))));
    }, signal);
  }

  function renderJob(j) {
    summary($('upgrade-summary'), [
      ['Cluster', j.cluster],
      ['Version', `${j.from_version || '?'} → ${j.version}`],
      ['State', `${j.state}${j.cancel_requested ? ' (cancel requested)' : ''}`],
      ['Now', j.current ? `${j.current.component}, step ${j.current.step}: ${j.current.step_name}` : '—'],
      ['Images from', j.image_repository],
      ['Forced', j.force ? 'yes' : 'no'],
      ['Created', fmtTime(j.created_at)],
      ['Finished', fmtTime(j.finished_at)],
      ['Error', j.error || 'none'],
    ]);
    renderInto($('upgrade-components'), JSON.stringify(j.progress), () => j.progress.map((c) => el('section',
      { class: 'component', 'data-testid': 'upgrade-component', 'data-component': c.component },
      el('h3', {}, `${c.component} `, el('span', { class: `state-${c.state}`, text: `(${c.state.replace('_', ' ')})` })),
      el('p', { class: 'muted', text: `${c.old_image || '?'} → ${c.new_image}` }),
      c.steps.length
        ? el('table', {},
          el('thead', {}, el('tr', {}, ...['Step', 'Name', 'State', 'Attempts', 'API retries', 'Started', 'Finished', 'Error']
            .map((h) => el('th', { scope: 'col', text: h })))),
          el('tbody', {}, ...c.steps.map((s) => el('tr', { 'data-testid': 'upgrade-step' },
            el('td', { text: s.step }), el('td', { text: s.name }), el('td', { class: `state-${s.state}`, text: s.state }),
            el('td', { text: s.attempts }), el('td', { text: s.api_retries }), el('td', { text: fmtShortTime(s.started_at) }),
            el('td', { text: fmtShortTime(s.finished_at) }), el('td', { text: s.error || '' })))))
        : el('p', { class: 'muted', text: 'Not started.' }))));
  }

  async function upgradeView(id, signal) {
    show('view-upgrade');
    document.title = `Upgrade #${id} · drover`;
    $('upgrade-title').textContent = `Upgrade job #${id}`;
    for (const n of ['upgrade-summary', 'upgrade-components', 'upgrade-events']) {
      $(n).replaceChildren();
      delete $(n).dataset.key;
    }
    const base = `/v1/upgrades/${encodeURIComponent(id)}`;
    const refresh = async () => {
      const [job, events] = await Promise.all([
        api('GET', base, undefined, undefined, signal),
        api('GET', `${base}/events?limit=20`, undefined, undefined, signal),
      ]);
      if (signal.aborted) return;
      clearProblemIfOk();
      renderJob(job);
      renderEvents($('upgrade-events'), events.items || []);
    };
    await watch(`${base}/stream`, refresh, {
      status: (j) => { if (j && j.progress) renderJob(j); },
      deleted: () => { notice(`Upgrade job #${id} was deleted.`); location.hash = '#/upgrades'; },
    }, signal);
  }

  // ------------------------------------------------------------ routing --

  const actions = { scale: null, pause: null };
  let running = null; // AbortController of the open view

  function stopView() {
    if (running) running.abort();
    running = null;
    actions.scale = null;
    actions.pause = null;
    setLiveMode('');
  }

  function route() {
    stopView();
    if (!token()) {
      show('login');
      $('token').focus();
      return;
    }
    clearProblem();
    const ctl = new AbortController();
    running = ctl;
    const parts = location.hash.replace(/^#\/?/, '').split('/').map(decodeURIComponent);
    let work;
    if (parts[0] === 'pools' && parts[1]) work = poolView(parts[1], ctl.signal);
    else if (parts[0] === 'upgrades' && parts[1]) work = upgradeView(parts[1], ctl.signal);
    else if (parts[0] === 'upgrades') work = upgradesView(ctl.signal);
    else work = poolsView(ctl.signal);
    work.catch(showProblem);
  }

  function signOut(message) {
    sessionStorage.removeItem(TOKEN_KEY);
    stopView();
    clearProblem();
    $('notice').hidden = true;
    const err = $('login-error');
    err.textContent = message || '';
    err.hidden = !message;
    show('login');
    $('token').value = '';
    $('token').focus();
  }

  // -------------------------------------------------------------- wiring --

  function wire() {
    $('login-form').addEventListener('submit', async (ev) => {
      ev.preventDefault();
      const value = $('token').value.trim();
      if (!value) return;
      sessionStorage.setItem(TOKEN_KEY, value);
      $('login-error').hidden = true;
      try {
        // Check the token before showing anything; a 401 signs out again.
        await api('GET', '/v1/pools?limit=1');
      } catch (err) {
        if (err.status !== 401) showProblem(err);
        if (!token()) return;
      }
      $('token').value = '';
      if (!location.hash || location.hash === '#') location.hash = '#/pools'; // hashchange routes
      else route();
    });

    $('logout').addEventListener('click', () => signOut('Signed out.'));
    $('problem-dismiss').addEventListener('click', clearProblem);

    $('scale-form').addEventListener('submit', async (ev) => {
      ev.preventDefault();
      const input = $('scale-input');
      const replicas = Number(input.value);
      if (!Number.isInteger(replicas) || replicas < 0) {
        showProblem(new Problem(0, 'Replicas must be a whole number', 'Enter 0 or more.'));
        return;
      }
      if (!actions.scale) return;
      const button = $('scale-submit');
      button.disabled = true;
      try {
        clearProblem();
        okSince = Date.now();
        await actions.scale(replicas);
      } catch (err) {
        okSince = Date.now();
        showProblem(err);
      } finally {
        button.disabled = false;
      }
    });

    for (const [id, paused] of [['pause', true], ['resume', false]]) {
      $(id).addEventListener('click', async () => {
        if (!actions.pause) return;
        try {
          clearProblem();
          await actions.pause(paused);
        } catch (err) {
          okSince = Date.now();
          showProblem(err);
        }
      });
    }

    window.addEventListener('hashchange', route);
    route();
  }

  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', wire);
  else wire();
})();
