// Keeping a view fresh: follow the resource's event stream while there is
// one, else poll.
//
// An open pool or job follows its stream (`status`, `event`, `deleted`
// messages) and refreshes the rest of the view once per burst of messages.
// Without a stream (404) it polls every POLL_MS; when a stream breaks it
// polls a few times, then tries the stream again. Lists just poll.

import { authorizedFetch } from './api.js';
import { sleep } from './dom.js';
import { setLiveMode, showProblem } from './feedback.js';
import { sseMessages } from './sse.js';

const POLL_MS = 1000;
const LIST_POLL_MS = 2000;
// Polls between a broken stream and the next attempt to open it.
const POLLS_BEFORE_RECONNECT = 5;
// Messages come in bursts; one refresh per burst.
const BURST_MS = 200;

// One attempt at the stream: 'missing' when the server has none, 'ended' or
// 'failed' when it stopped or never started, 'signed-out' on 401.
async function follow(path, refresh, handlers, signal) {
  let res;
  try {
    res = await authorizedFetch(path, { headers: { Accept: 'text/event-stream' }, signal });
  } catch (err) {
    return err.status === 401 ? 'signed-out' : 'failed';
  }
  const type = res.headers.get('content-type') || '';
  if (!res.ok || !res.body || !type.startsWith('text/event-stream')) {
    if (res.body) res.body.cancel().catch(() => {});
    return [404, 405, 501].includes(res.status) || res.ok ? 'missing' : 'failed';
  }
  setLiveMode('Live (stream)');
  let pending = null;
  const soon = () => {
    if (pending) return;
    pending = setTimeout(() => {
      pending = null;
      if (!signal.aborted) refresh().catch(showProblem);
    }, BURST_MS);
  };
  try {
    for await (const { event, data } of sseMessages(res.body)) {
      let value = null;
      try { value = JSON.parse(data); } catch (_) { /* not JSON: handlers get null */ }
      handlers[event]?.(value);
      if (event !== 'deleted') soon();
    }
    return 'ended';
  } catch (_) {
    return 'failed';
  }
}

// Keeps a view fresh until `signal` aborts.
export async function watch(streamPath, refresh, handlers, signal) {
  await refresh().catch(showProblem);
  while (!signal.aborted) {
    const result = await follow(streamPath, refresh, handlers, signal);
    if (result === 'signed-out' || signal.aborted) return;
    const missing = result === 'missing';
    setLiveMode(missing ? 'Live (polling every second)' : 'Live (polling; reconnecting to the stream)');
    for (let i = 0; (missing || i < POLLS_BEFORE_RECONNECT) && !signal.aborted; i++) {
      await sleep(POLL_MS, signal);
      if (!signal.aborted) await refresh().catch(showProblem);
    }
  }
}

// A list view's loop: refresh every LIST_POLL_MS until `signal` aborts.
export async function poll(refresh, signal) {
  setLiveMode('Live (polling)');
  while (!signal.aborted) {
    await refresh().catch(showProblem);
    await sleep(LIST_POLL_MS, signal);
  }
}
