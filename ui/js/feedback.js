// What the page tells the user besides the views: the problem banner (an
// API error's title and detail), passing notices, and the live-update mode
// in the top bar.

import { Problem } from './api.js';
import { $ } from './dom.js';

// A good refresh clears a stale error after a few seconds, not at once, so
// that the answer to a button press stays readable.
const PROBLEM_STAYS_MS = 5000;
const NOTICE_MS = 4000;

let problemShownAt = 0;
let noticeTimer = null;

export function showProblem(err) {
  if (!err || err.name === 'AbortError') return;
  if (err.status === 401) return; // signing out already said so
  $('problem-title').textContent = err instanceof Problem ? err.title : 'Could not reach drover';
  $('problem-detail').textContent = err instanceof Problem ? err.detail : String(err.message || err);
  $('problem').hidden = false;
  problemShownAt = Date.now();
}

export function clearProblem() {
  $('problem').hidden = true;
}

// After a successful refresh.
export function clearProblemIfStale() {
  if (!$('problem').hidden && Date.now() - problemShownAt > PROBLEM_STAYS_MS) clearProblem();
}

export function notice(text) {
  $('notice').textContent = text;
  $('notice').hidden = false;
  clearTimeout(noticeTimer);
  noticeTimer = setTimeout(() => { $('notice').hidden = true; }, NOTICE_MS);
}

export function hideNotice() {
  clearTimeout(noticeTimer);
  $('notice').hidden = true;
}

export function setLiveMode(text) {
  const node = $('live-mode');
  node.textContent = text;
  node.hidden = !text;
}
