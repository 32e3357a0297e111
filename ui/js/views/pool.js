// #/pools/<name>: one pool's summary, conditions, controls (scale, pause,
// resume), rollout, machines by engine and recent events, kept live.

import { Problem, api, get, listAll } from '../api.js';
import { $, el, fmtAgo, renderInto, reset, summary } from '../dom.js';
import { clearProblem, clearProblemIfStale, notice, showProblem } from '../feedback.js';
import { watch } from '../live.js';
import { renderEvents } from './events.js';
import { renderMachines } from './machines.js';

// The open pool, for the controls; null while another view is open.
let open = null;

function placement(p) {
  if (p.engines && p.engines.length) return `engines ${p.engines.join(', ')}`;
  const selector = Object.entries(p.engine_selector || {}).map(([k, v]) => `${k}=${v}`);
  return selector.length ? `engines labelled ${selector.join(', ')}` : 'any engine';
}

function renderSummary(p) {
  const s = p.status;
  summary($('pool-summary'), [
    ['Replicas', `${p.replicas} desired, ${s.replicas} exist, ${s.ready_replicas} ready, ` +
      `${s.available_replicas ?? '—'} available, ${s.updated_replicas} updated, ` +
      `${s.terminating_replicas ?? 0} terminating`],
    ['Image', p.desired_image],
    ['Version', p.version],
    ['Placement', placement(p)],
    ['Phase', p.phase],
    ['Paused', p.paused ? 'yes' : 'no'],
    ['Generation', `${p.generation} (observed ${s.observed_generation ?? '—'})`],
    ['Last error', s.last_error || 'none'],
    ['Driven by', s.driver || 'this server (one replica)'],
  ]);
}

// Every condition is good when True; a False one is marked.
function renderConditions(conditions) {
  const rows = conditions.map((c) => [c.type, c.status, c.reason, c.message, c.last_transition_time]);
  renderInto($('pool-conditions'), JSON.stringify(rows), () => rows.map(([type, status, reason, message, since]) =>
    el('tr', { 'data-testid': 'condition', 'data-type': type, 'data-status': status },
      el('th', { scope: 'row', text: type }),
      el('td', { class: status === 'True' ? 'good' : 'bad', text: status }),
      el('td', { text: reason }),
      el('td', { text: message }),
      el('td', {}, el('time', { datetime: since, title: new Date(since).toLocaleString(), text: fmtAgo(since) })))));
}

function renderRollout(r) {
  const bar = $('rollout-bar');
  const target = Math.max(r.replicas, 1);
  bar.max = target;
  bar.value = Math.min(r.counts.updated_available, target);
  const parts = [
    `State: ${r.state.replace('_', ' ')}${r.reason ? ` (${r.reason})` : ''}`,
    `${r.counts.updated_available} of ${r.replicas} updated and available`,
    `${r.counts.total} machines, ${r.counts.ready} ready, ${r.counts.outdated} outdated` +
      (r.counts.terminating ? `, ${r.counts.terminating} terminating` : ''),
    `${r.remaining} remaining`,
  ];
  if (r.estimated_seconds_remaining !== null && r.estimated_seconds_remaining !== undefined) {
    parts.push(`about ${Math.ceil(r.estimated_seconds_remaining)} s left`);
  }
  if (r.batch && r.batch.awaiting_approval) parts.push('waiting for batch approval');
  $('rollout-text').textContent = `${parts.join(' · ')}.`;
  $('rollout-text').dataset.state = r.state;
}

function renderPool(p) {
  renderSummary(p);
  renderConditions(p.status.conditions || []);
  $('pause').disabled = p.paused;
  $('resume').disabled = !p.paused;
  if (!open.scaleShown && document.activeElement !== $('scale-input')) {
    $('scale-input').value = p.replicas;
    open.scaleShown = true;
  }
}

export const poolView = {
  id: 'view-pool',
  nav: 'nav-pools',
  title: ([name]) => name,
  async run([name], signal) {
    $('pool-title').textContent = `Pool ${name}`;
    reset('pool-summary', 'pool-conditions', 'machine-grid', 'image-legend', 'pool-events');
    $('rollout-text').textContent = '';
    const base = `/v1/pools/${encodeURIComponent(name)}`;
    const refresh = async () => {
      const [p, machines, rollout, events, engines] = await Promise.all([
        get(base, signal),
        listAll(`${base}/machines?limit=500`, signal),
        get(`${base}/rollout`, signal),
        get(`${base}/events?limit=20`, signal),
        // Only for the engines' reachability in the group headings.
        listAll('/v1/engines?limit=500', signal).catch(() => null),
      ]);
      if (signal.aborted) return;
      clearProblemIfStale();
      renderPool(p);
      renderMachines(p, machines, engines);
      renderRollout(rollout);
      renderEvents($('pool-events'), events.items || []);
    };
    open = { name, base, refresh, scaleShown: false };
    signal.addEventListener('abort', () => { open = null; }, { once: true });
    await watch(`${base}/stream`, refresh, {
      status: (p) => { if (p && p.name === name && p.status && open) renderPool(p); },
      deleted: () => { notice(`Pool ${name} was deleted.`); location.hash = '#/pools'; },
    }, signal);
  },
};

// Runs a control's action against the open pool, showing its problem if
// it fails. `busy` (a button) is disabled meanwhile.
async function act(action, busy = null) {
  if (!open) return;
  const pool = open;
  if (busy) busy.disabled = true;
  try {
    clearProblem();
    await action(pool);
    await pool.refresh();
  } catch (err) {
    showProblem(err);
  } finally {
    if (busy) busy.disabled = false;
  }
}

// The scale form and the pause/resume buttons; wired once, they act on
// whichever pool is open.
export function wirePoolControls() {
  $('scale-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    const replicas = Number($('scale-input').value);
    if (!Number.isInteger(replicas) || replicas < 0) {
      showProblem(new Problem(0, 'Replicas must be a whole number', 'Enter 0 or more.'));
      return;
    }
    act(async (pool) => {
      await api('PUT', `${pool.base}/scale`, { body: { replicas } });
      notice(`Scaling ${pool.name} to ${replicas}.`);
      pool.scaleShown = false;
    }, $('scale-submit'));
  });
  for (const [id, paused] of [['pause', true], ['resume', false]]) {
    // Not disabled while busy: the pool's `paused` decides which is enabled.
    $(id).addEventListener('click', () => act(async (pool) => {
      await api('PATCH', pool.base, { body: { paused }, contentType: 'application/merge-patch+json' });
      notice(paused ? `Paused ${pool.name}.` : `Resumed ${pool.name}.`);
    }));
  }
}
