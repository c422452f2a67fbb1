// The dtrain dashboard: three views over the coordinator's HTTP JSON API (/api/v1/), picked by
// the URL's fragment: #/ the cluster, #/jobs the jobs table, #/jobs/<id> one job. Everything a
// user wrote (names, log lines, metric names, reasons) is put on the page as text, never as
// markup. Live parts follow the server-sent events of /api/v1/events, or poll where a view
// reads incrementally (metric points with `since`, the log with `offset`).
'use strict';

// ---- helpers -------------------------------------------------------------------------------

// An element with attributes and children; strings become text nodes (escaped by the DOM).
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === 'class') e.className = value;
    else if (key.startsWith('on')) e.addEventListener(key.slice(2), value);
    else e.setAttribute(key, value === true ? '' : String(value));
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null) continue;
    e.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return e;
}

async function api(path, options) {
  const response = await fetch(path, Object.assign({credentials: 'same-origin'}, options || {}));
  if (response.status === 401) {
    location.href = '/login';
    throw new Error('log in first');
  }
  const body = await response.json();
  if (!response.ok) {
    throw new Error(body.error ? `${body.error.code}: ${body.error.message}` : response.statusText);
  }
  return body;
}

const ended = (state) => ['SUCCEEDED', 'FAILED', 'CANCELLED'].includes(state);

// proto3 JSON writes int64 as strings.
const num = (v) => (v === undefined || v === null || v === '' ? 0 : Number(v));
const fmt = (v, digits) => (typeof v === 'number' && isFinite(v) ? v.toFixed(digits) : '-');

function duration(seconds) {
  seconds = Math.round(num(seconds));
  if (seconds <= 0) return '-';
  const h = Math.floor(seconds / 3600), m = Math.floor((seconds % 3600) / 60), s = seconds % 60;
  return h > 0 ? `${h}h ${m}m` : m > 0 ? `${m}m ${s}s` : `${s}s`;
}

function bytes(n) {
  n = num(n);
  if (n >= 1e9) return (n / 1e9).toFixed(2) + ' GB';
  if (n >= 1e6) return (n / 1e6).toFixed(1) + ' MB';
  if (n >= 1e3) return (n / 1e3).toFixed(0) + ' kB';
  return n + ' B';
}

function ago(ms) {
  ms = num(ms);
  return ms < 1000 ? 'just now' : (ms / 1000).toFixed(1) + ' s ago';
}

function stateBadge(state) {
  return el('span', {class: 'state ' + state}, String(state || '').replace('GROUP_STATE_', ''));
}

function showError(error) {
  const box = document.getElementById('error');
  box.textContent = error ? String(error.message || error) : '';
  box.hidden = !error;
}

function setLive(on) {
  const live = document.getElementById('live');
  live.textContent = on ? 'live' : 'reconnecting';
  live.classList.toggle('on', on);
}

// What a view stops when another one takes the page.
let stops = [];
function onLeave(stop) {
  stops.push(stop);
}
function every(ms, fn) {
  const id = setInterval(fn, ms);
  onLeave(() => clearInterval(id));
}
// onOpen runs each time the stream (re)connects: a stream's first events are only the jobs that
// have not ended, so what ended while no stream was open is read again there.
function events(query, onJob, onOpen) {
  const source = new EventSource('/api/v1/events' + query);
  source.addEventListener('open', () => {
    setLive(true);
    if (onOpen) onOpen();
  });
  source.addEventListener('error', () => setLive(false));
  source.addEventListener('job', (event) => onJob(JSON.parse(event.data)));
  onLeave(() => source.close());
}

function progressText(job) {
  const p = job.progress || {};
  const parts = [];
  if (num(p.maxEpochs) > 0) parts.push(`epoch ${num(p.epoch) + 1}/${num(p.maxEpochs)}`);
  if (num(p.totalSteps) > 0) parts.push(`step ${num(p.globalStep)}/${num(p.totalSteps)}`);
  else if (num(p.globalStep) > 0) parts.push(`step ${num(p.globalStep)}`);
  if (p.phase) parts.push(p.phase);
  return parts.join(', ');
}

const KEY_METRICS = ['val_acc', 'test_acc', 'val_loss', 'train_loss'];
// "time: setup 0.5 s, train 39.9 s, ...": where the run's seconds went (JobProgress.phaseSeconds).
function phasesText(p) {
  const order = ['placement', 'setup', 'first_step', 'restore', 'train', 'validation', 'checkpoint',
                 'test', 'predict'];
  const seconds = p.phaseSeconds || {};
  const parts = order.filter((k) => seconds[k] !== undefined)
    .map((k) => `${k.replace('_', ' ')} ${fmt(num(seconds[k]), 1)} s`);
  return parts.length ? 'time: ' + parts.join(', ') : '';
}

// The usual ones, then what the model logs with prog_bar=True (Lightning's progress bar).
function keyMetrics(job) {
  const m = job.metrics || {};
  const progBar = (job.progress || {}).progBar || [];
  const names = KEY_METRICS.concat(progBar.filter((k) => !KEY_METRICS.includes(k)));
  return names.filter((k) => k in m).map((k) => `${k} ${fmt(m[k], 4)}`).join('  ');
}

// ---- cluster -------------------------------------------------------------------------------

async function renderCluster(main) {
  const body = el('div');
  main.replaceChildren(el('h1', {}, 'Cluster'), body);
  const draw = async () => {
    const c = await api('/api/v1/cluster');
    const counts = c.jobsByState || {};
    const cards = el('div', {class: 'cards'},
      ['QUEUED', 'RUNNING', 'SUCCEEDED', 'FAILED', 'CANCELLED'].map((s) =>
        el('div', {class: 'card', id: 'count-' + s},
          el('div', {class: 'value'}, num(counts[s])), el('div', {class: 'label'}, s.toLowerCase() + ' jobs'))),
      el('div', {class: 'card'}, el('div', {class: 'value'}, fmt(num(c.samplesPerSecond), 0)),
        el('div', {class: 'label'}, 'samples/s, all running jobs')));
    const workers = el('table', {id: 'workers'},
      el('tr', {}, ['worker', 'state', 'host', 'address', 'devices', 'job', 'last heartbeat'].map((h) => el('th', {}, h))),
      (c.workers || []).map((w) => el('tr', {},
        el('td', {}, w.name), el('td', {}, stateBadge(w.state)), el('td', {}, w.host),
        el('td', {}, w.address), el('td', {class: 'num'}, num(w.devices)),
        el('td', {}, w.jobId || w.assignedJobId ? el('a', {href: '#/jobs/' + encodeURIComponent(w.jobId || w.assignedJobId)}, w.jobId || w.assignedJobId) : '-'),
        el('td', {}, ago(w.lastSeenMsAgo)))));
    const groups = el('table', {id: 'groups'},
      el('tr', {}, ['group', 'state', 'world size', 'members', 'failure'].map((h) => el('th', {}, h))),
      (c.groups || []).map((g) => el('tr', {},
        el('td', {}, g.group), el('td', {}, stateBadge(g.state)), el('td', {class: 'num'}, num(g.worldSize)),
        el('td', {}, (g.members || []).map((m) => `rank ${num(m.rank)} ${m.name || ''}${m.host ? ' on ' + m.host : ''}`).join(', ')),
        el('td', {}, g.failure || ''))));
    body.replaceChildren(cards, el('h2', {}, 'Workers'), workers, el('h2', {}, 'Groups'), groups);
  };
  await draw();
  setLive(true);
  every(2000, () => draw().then(() => showError(null), showError));
}

// ---- jobs ----------------------------------------------------------------------------------

const jobsState = {sort: 'submitted', order: 'desc', token: '0', pageSize: 50};

function jobRow(job) {
  const p = job.progress || {};
  return el('tr', {'data-job': job.id},
    el('td', {}, el('a', {href: '#/jobs/' + encodeURIComponent(job.id)}, job.id)),
    el('td', {}, job.name),
    el('td', {}, stateBadge(job.state)),
    el('td', {}, progressText(job)),
    el('td', {class: 'num'}, job.state === 'RUNNING' ? fmt(num(p.samplesPerSecond), 0) : '-'),
    el('td', {class: 'num'}, job.state === 'RUNNING' ? duration(p.etaSeconds) : '-'),
    el('td', {}, keyMetrics(job)));
}

async function renderJobs(main) {
  const columns = [['id', 'job'], ['name', 'name'], ['state', 'state'], ['step', 'progress'],
                   ['samples_per_second', 'samples/s'], [null, 'ETA'], [null, 'metrics']];
  const table = el('table', {id: 'jobs'});
  const pager = el('div', {class: 'pager'});
  main.replaceChildren(el('h1', {}, 'Jobs'), pager, table);
  const draw = async () => {
    const q = `?page_size=${jobsState.pageSize}&page_token=${jobsState.token}` +
              `&sort=${jobsState.sort}&order=${jobsState.order}`;
    const page = await api('/api/v1/jobs' + q);
    const head = el('tr', {}, columns.map(([key, label]) => {
      if (!key) return el('th', {}, label);
      const sorted = jobsState.sort === key;
      return el('th', {
        class: 'sortable' + (sorted ? ' sorted' + (jobsState.order === 'asc' ? ' asc' : '') : ''),
        onclick: () => {
          jobsState.order = sorted && jobsState.order === 'desc' ? 'asc' : 'desc';
          jobsState.sort = key;
          jobsState.token = '0';
          draw().catch(showError);
        },
      }, label);
    }));
    table.replaceChildren(head, ...(page.jobs || []).map(jobRow));
    const first = num(jobsState.token), total = num(page.totalSize);
    const shown = (page.jobs || []).length;
    pager.replaceChildren(
      el('button', {disabled: first === 0, onclick: () => {
        jobsState.token = String(Math.max(0, first - jobsState.pageSize)); draw().catch(showError);
      }}, 'newer'),
      el('span', {}, total === 0 ? 'no jobs yet' : `${first + 1}-${first + shown} of ${total}`),
      el('button', {disabled: !page.nextPageToken, onclick: () => {
        jobsState.token = page.nextPageToken; draw().catch(showError);
      }}, 'older'));
  };
  await draw();
  // A changed job is redrawn in place; a new one (on the first page) redraws the page.
  events('', (job) => {
    const row = table.querySelector(`tr[data-job="${CSS.escape(job.id)}"]`);
    if (row) row.replaceWith(jobRow(job));
    else if (jobsState.token === '0') draw().catch(showError);
  }, () => draw().catch(showError));
}

// ---- one job -------------------------------------------------------------------------------

// Metrics on shared axes by what they measure: train_loss and val_loss on one chart (as
// TensorBoard's scalars group by tag), train_acc, train_acc_step and val_acc on another (the
// _step / _epoch of self.log's both-ways values), LearningRateMonitor's lr-AdamW/pg1, /pg2 on
// one chart per optimizer, anything else alone.
function family(name) {
  const unsuffixed = name.replace(/_(step|epoch)$/, '').replace(/\/pg\d+$/, '');
  const base = unsuffixed.replace(/^(train|val|test)_/, '');
  return base === unsuffixed ? unsuffixed : base;
}
// An accuracy is a fraction: its axis runs from 0 to 1, not to whatever the data suggests.
function isFraction(fam) {
  return /(^|_)acc(uracy)?($|_)/.test(fam);
}
const COLORS = ['#2f5fd0', '#d0472f', '#1b998b', '#a05cd5', '#e39b16', '#51606f'];

function newChart(canvas, title) {
  const y = isFraction(title) ? {type: 'linear', min: 0, max: 1} : {type: 'linear'};
  return new Chart(canvas, {
    type: 'line',
    data: {datasets: []},
    options: {
      animation: false,
      parsing: false,
      normalized: true,
      maintainAspectRatio: false,
      interaction: {mode: 'nearest', intersect: false},
      // A job logging at its full rate has more points than pixels: draw a faithful 500.
      plugins: {title: {display: true, text: title}, legend: {position: 'bottom'},
                decimation: {enabled: true, algorithm: 'lttb', samples: 500}},
      scales: {x: {type: 'linear', title: {display: true, text: 'step'}}, y},
    },
  });
}

async function renderJob(main, id) {
  const header = el('div');
  const reason = el('div');
  const charts = el('div', {class: 'charts', id: 'charts'});
  const files = el('div');
  const log = el('pre', {id: 'log'});
  const follow = el('input', {type: 'checkbox', id: 'follow', checked: true});
  const spec = el('pre', {id: 'spec'});
  main.replaceChildren(header, reason,
    el('h2', {}, 'Metrics'), charts,
    el('h2', {}, 'Checkpoints and files'), files,
    el('div', {class: 'row'}, el('h2', {}, 'Log'), el('label', {}, follow, ' follow')), log,
    el('h2', {}, 'Resolved spec'), spec);

  // A job never leaves an ended state, but answers can arrive out of order: the cancel request's
  // answer (still RUNNING) may come after the event that says CANCELLED, which is not sent again.
  let endedShown = false;
  const drawHeader = (job) => {
    const terminal = ended(job.state);
    if (endedShown && !terminal) return;
    endedShown = terminal;
    // An ended job has nothing to cancel: no button.
    const cancel = terminal ? null : el('button', {class: 'danger', id: 'cancel', onclick: async () => {
      cancel.disabled = true;
      try {
        drawHeader(await api(`/api/v1/jobs/${encodeURIComponent(id)}/cancel`, {method: 'POST'}));
      } catch (error) {
        showError(error);
        cancel.disabled = false;
      }
    }}, 'Cancel');
    const p = job.progress || {};
    header.replaceChildren(
      el('div', {class: 'row'}, el('h1', {id: 'job-title'}, job.id), stateBadge(job.state), cancel),
      el('div', {class: 'row muted'},
        el('span', {}, 'name ', job.name), el('span', {id: 'progress'}, progressText(job)),
        job.state === 'RUNNING' ? el('span', {}, `${fmt(num(p.samplesPerSecond), 0)} samples/s, ETA ${duration(p.etaSeconds)}`) : null,
        (job.workers || []).length ? el('span', {}, 'workers ' + job.workers.join(', ')) : null,
        p.collectivePlane ? el('span', {id: 'plane'}, 'collectives over ' + p.collectivePlane) : null),
      el('div', {class: 'row muted', id: 'metrics'}, keyMetrics(job)),
      phasesText(p) ? el('div', {class: 'row muted', id: 'phases'}, phasesText(p)) : null);
    reason.replaceChildren(job.reason ? el('div', {class: 'reason', id: 'reason'}, job.reason) : '');
    files.replaceChildren((job.files || []).length === 0
      ? el('p', {class: 'muted'}, 'none yet')
      : el('table', {id: 'files'},
          el('tr', {}, ['file', 'size', 'step', ''].map((h) => el('th', {}, h))),
          job.files.map((f) => el('tr', {},
            el('td', {}, f.digest
              ? el('a', {href: `/api/v1/jobs/${encodeURIComponent(id)}/files/${encodeURIComponent(f.name)}`, download: f.name}, f.name)
              : f.name),
            el('td', {class: 'num'}, bytes(f.sizeBytes)), el('td', {class: 'num'}, num(f.step)),
            el('td', {class: 'muted'},
              f.location === job.bestCheckpoint ? 'best' : '', f.location === job.checkpoint ? ' last' : '',
              f.digest ? '' : ' on the workers: ' + f.location)))));
  };

  const job = await api('/api/v1/jobs/' + encodeURIComponent(id));
  drawHeader(job);
  spec.textContent = JSON.stringify(job.spec || {}, null, 2);

  // Metric points, read incrementally.
  const byFamily = new Map();
  let since = 0;
  const readPoints = async () => {
    const page = await api(`/api/v1/jobs/${encodeURIComponent(id)}/metrics?since=${since}`);
    since = num(page.nextPoint);
    const touched = new Set();
    for (const point of page.points || []) {
      const fam = family(point.name);
      if (!byFamily.has(fam)) {
        const canvas = el('canvas', {'data-family': fam});
        charts.append(el('div', {class: 'chart'}, canvas));
        byFamily.set(fam, newChart(canvas, fam));
      }
      const chart = byFamily.get(fam);
      let dataset = chart.data.datasets.find((d) => d.label === point.name);
      if (!dataset) {
        const color = COLORS[chart.data.datasets.length % COLORS.length];
        dataset = {label: point.name, data: [], borderColor: color, backgroundColor: color,
                   pointRadius: 2, borderWidth: 1.5};
        chart.data.datasets.push(dataset);
      }
      dataset.data.push({x: num(point.step), y: point.value});
      touched.add(chart);
    }
    for (const chart of touched) chart.update('none');
    if (page.truncated) return readPoints();
  };

  // The log, from where the last read ended.
  let offset = 0;
  const readLog = async () => {
    const page = await api(`/api/v1/jobs/${encodeURIComponent(id)}/logs?offset=${offset}`);
    offset = num(page.nextLine);
    if ((page.lines || []).length) {
      log.append(document.createTextNode(page.lines.join('\n') + '\n'));
      // The page keeps the last ~20,000 lines of a long log (the API has the rest by offset).
      while (log.childNodes.length > 1 && log.textContent.length > 2000000) log.firstChild.remove();
      if (follow.checked) log.scrollTop = log.scrollHeight;
    }
    if (page.truncated) return readLog();
  };

  await Promise.all([readPoints(), readLog()]);
  let over = ended(job.state);
  every(2000, () => {
    if (over && !follow.checked) return;
    Promise.all([readPoints(), follow.checked ? readLog() : null]).then(() => showError(null), showError);
  });
  events('?job=' + encodeURIComponent(id), (update) => {
    drawHeader(update);
    if (ended(update.state)) {
      over = true;
      readPoints().catch(showError);
      readLog().catch(showError);
    }
  });
  onLeave(() => byFamily.forEach((chart) => chart.destroy()));
}

// ---- routing -------------------------------------------------------------------------------

async function route() {
  for (const stop of stops) stop();
  stops = [];
  showError(null);
  const main = document.getElementById('main');
  const hash = location.hash || '#/';
  const match = hash.match(/^#\/jobs\/(.+)$/);
  const view = match ? 'job' : hash.startsWith('#/jobs') ? 'jobs' : 'cluster';
  document.querySelectorAll('nav a').forEach((a) =>
    a.classList.toggle('active', a.dataset.view === (view === 'job' ? 'jobs' : view)));
  try {
    if (view === 'job') await renderJob(main, decodeURIComponent(match[1]));
    else if (view === 'jobs') await renderJobs(main);
    else await renderCluster(main);
  } catch (error) {
    showError(error);
  }
}

window.addEventListener('hashchange', route);
route();
