// A pool's machines as cells, grouped by the engine they run on, with the
// legend of images. A cell's fill is its phase, its border and corner letter
// its image; the phase is always spelled out too, so colour is never the
// only signal.

import { $, el, plural, renderInto } from '../dom.js';

// [state (the cell's class and data-state), glyph, words] for a machine.
function machineState(m) {
  switch (m.phase) {
    case 'running': return m.ready ? ['ready', '✓', 'running, ready'] : ['starting', '○', 'running, not ready'];
    case 'starting': return ['starting', '○', 'starting'];
    case 'creating': return ['creating', '…', 'creating'];
    case 'exited': return ['exited', '✕', 'exited'];
    case 'dead': return ['dead', '✕', 'dead'];
    case 'paused': return ['paused', '‖', 'paused'];
    case 'terminating': return ['terminating', '−', 'terminating'];
    default: return ['unknown', '?', 'unknown'];
  }
}

// Short notes under the phase, each [shown, spoken].
function notes(m) {
  const n = [];
  if (m.exit_code !== null && m.exit_code !== undefined) {
    // A machine restarted in place runs again; the code is its last run's.
    const last = ['exited', 'dead'].includes(m.phase) ? '' : 'last ';
    n.push([`${last}exit ${m.exit_code}`, `${last}exit code ${m.exit_code}`]);
  }
  if (m.oom_killed) n.push(['OOM', 'killed for lack of memory']);
  if (m.restarts > 0) n.push([`↻${m.restarts}`, `restarted ${plural(m.restarts, 'time')}`]);
  if (m.phase === 'terminating' && m.terminating_reason) n.push([m.terminating_reason, m.terminating_reason]);
  else if (m.delete_requested) n.push(['marked', 'marked for deletion']);
  return n;
}

const imageTag = (i) => String.fromCharCode(65 + (i % 26)) + (i >= 26 ? String(Math.floor(i / 26)) : '');

function cell(c) {
  const spoken = [c.words, ...c.notes.map((n) => n[1])].join(', ');
  return el('li', {
    class: `cell st-${c.state} img-${c.i % 8}`,
    'data-testid': 'machine-cell',
    'data-machine': c.name,
    'data-state': c.state,
    'data-phase': c.phase,
    'data-engine': c.engine,
    'data-image': c.image,
    title: `${c.name}: ${spoken}; image ${c.image}`,
    'aria-label': `${c.name}: ${spoken}; image ${imageTag(c.i)} (${c.image})`,
  },
  el('span', { class: 'img-tag', 'aria-hidden': 'true', text: imageTag(c.i) }),
  el('span', { class: 'mname', text: c.name }),
  el('span', { class: 'mstate' }, el('span', { class: 'glyph', 'aria-hidden': 'true', text: c.glyph }), c.words),
  c.notes.length ? el('span', { class: 'mnote', 'aria-hidden': 'true', text: c.notes.map((n) => n[0]).join(' · ') }) : null);
}

// "2 machines, 2 ready, 1 terminating · engine unreachable": a group's
// heading. The counts are the pool status's (machines counted toward
// `replicas`); cells beyond them are terminating, or given up with their
// engine and replaced elsewhere.
function groupFacts(g) {
  const facts = [plural(g.counts.replicas, 'machine'), `${g.counts.ready_replicas} ready`];
  if (g.terminating) facts.push(`${g.terminating} terminating`);
  const uncounted = g.cells.length - g.counts.replicas - g.terminating;
  if (uncounted > 0) facts.push(`${uncounted} ${g.reachability === 'unreachable' ? 'given up for lost' : 'not counted'}`);
  const engine = [];
  if (g.reachability && g.reachability !== 'reachable') engine.push(g.reachability);
  if (g.draining) engine.push('draining');
  return facts.join(', ') + (engine.length ? ` · engine ${engine.join(', ')}` : '');
}

// `engines` is GET /v1/engines' items, or null when they could not be read.
export function renderMachines(pool, machines, engines) {
  // Desired image first, then the others by name, so letters stay put.
  const images = [...new Set(machines.map((m) => m.image))].filter((i) => i !== pool.desired_image).sort();
  images.unshift(pool.desired_image);
  const index = new Map(images.map((img, i) => [img, i]));
  const perEngine = pool.status.engines || {};
  const names = [...new Set([...Object.keys(perEngine), ...machines.map((m) => m.engine)])].sort();
  const groups = names.map((name) => {
    const here = machines.filter((m) => m.engine === name);
    const engine = (engines || []).find((e) => e.name === name);
    return {
      name,
      counts: perEngine[name] || { replicas: 0, ready_replicas: 0 },
      terminating: here.filter((m) => m.phase === 'terminating').length,
      reachability: engine ? engine.status.reachability : null,
      draining: engine ? engine.draining : false,
      cells: here.map((m) => {
        const [state, glyph, words] = machineState(m);
        return { name: m.name, engine: m.engine, image: m.image, phase: m.phase, state, glyph, words,
          notes: notes(m), i: index.get(m.image) };
      }),
    };
  });
  $('machine-count').textContent = `(${machines.length} on ${plural(groups.length, 'engine')})`;
  renderInto($('machine-grid'), JSON.stringify(groups), () => (groups.length ? groups : [null]).map((g) => (g
    ? el('section', { class: 'engine-group', 'data-testid': 'engine-group', 'data-engine': g.name,
      'aria-label': `Engine ${g.name}` },
    el('h4', {}, el('a', { href: '#/engines', text: g.name }), ' ',
      el('span', { class: 'muted', 'data-testid': 'engine-group-facts', text: groupFacts(g) })),
    el('ul', { class: 'grid', 'aria-label': `Machines on ${g.name}` }, ...g.cells.map(cell)))
    : el('p', { class: 'muted', text: 'No machines.' }))));

  const legend = images.filter((img) => img === pool.desired_image || machines.some((m) => m.image === img));
  renderInto($('image-legend'), JSON.stringify(legend), () => legend.map((img) => {
    const i = index.get(img);
    return el('li', { 'data-testid': 'image-legend-item' },
      el('span', { class: `swatch img img-${i % 8}`, 'aria-hidden': 'true' }),
      el('strong', { text: imageTag(i) }),
      ` ${img}${img === pool.desired_image ? ' (desired)' : ''}`);
  }));
}
