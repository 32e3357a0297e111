// #/pools: every pool, one row each.

import { listAll } from '../api.js';
import { $, el, renderInto } from '../dom.js';
import { clearProblemIfStale } from '../feedback.js';
import { poll } from '../live.js';

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

// "a 2/2 · b 1/2": ready of existing machines, per engine.
function engineSpread(status) {
  const parts = Object.entries(status.engines || {})
    .map(([name, e]) => `${name} ${e.ready_replicas}/${e.replicas}`);
  return parts.length ? parts.join(' · ') : '—';
}

// The MachinesHealthy condition, shortened: "yes", or its reason.
function health(status) {
  const c = (status.conditions || []).find((x) => x.type === 'MachinesHealthy');
  if (!c) return '—';
  return c.status === 'True' ? 'yes' : c.reason;
}

// Index of the health column after the name.
const HEALTH = 5;

export const poolsView = {
  id: 'view-pools',
  nav: 'nav-pools',
  title: () => 'Pools',
  async run(_params, signal) {
    await poll(async () => {
      const pools = await listAll('/v1/pools?limit=500', signal);
      if (signal.aborted) return;
      clearProblemIfStale();
      $('pools-empty').hidden = pools.length > 0;
      const rows = pools.map((p) => [p.name, p.replicas, p.status.ready_replicas, p.status.updated_replicas,
        p.status.terminating_replicas ?? 0, engineSpread(p.status), health(p.status), p.phase, rolloutState(p),
        p.status.driver || 'this server']);
      renderInto($('pools-body'), JSON.stringify(rows), () => rows.map(([name, ...rest]) => el('tr',
        { 'data-testid': 'pool-row', 'data-pool': name },
        el('td', {}, el('a', { href: `#/pools/${encodeURIComponent(name)}`, 'data-testid': 'pool-link', text: name })),
        ...rest.map((v, i) => el('td', { text: v, class: i === HEALTH && v !== 'yes' && v !== '—' ? 'bad' : null })))));
    }, signal);
  },
};
