// The review console's script (served inline by src/console/page.rs, under a CSP nonce). Every
// value from the server goes into the page as text (textContent), never as markup.
(() => {
  'use strict';
  const csrf = document.body.dataset.csrf;
  const $ = (id) => document.getElementById(id);
  let items = [];
  let sel = 0;
  let waiting = 0;
  // Labels posted and not yet answered: kept out of queue reloads meanwhile.
  const pending = new Set();
  // Bumped by each answered label, so that a queue reload started before it is discarded.
  let generation = 0;
  let itemSeq = 0;

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  const fmt = (x, digits) => (x === null || x === undefined ? null : Number(x).toFixed(digits === undefined ? 3 : digits));
  const time = (ms) => new Date(ms).toISOString().replace('T', ' ').slice(0, 19) + ' UTC';
  function status(text, bad) {
    const s = $('status');
    s.textContent = text;
    s.className = bad ? 'bad' : '';
  }
  async function call(url, options) {
    const r = await fetch(url, Object.assign({ credentials: 'same-origin' }, options || {}));
    if (r.status === 401) {
      location.reload();
      throw new Error('signed out');
    }
    const body = await r.json();
    if (!r.ok) throw new Error(body.error ? body.error.message : r.statusText);
    return body;
  }
  function filters() {
    const p = new URLSearchParams();
    for (const k of ['tenant', 'scenario', 'rule', 'lang']) {
      const v = $('f-' + k).value.trim();
      if (v) p.set(k, v);
    }
    return p.toString();
  }

  function renderQueue() {
    const list = $('queue');
    list.replaceChildren();
    items.forEach((it, i) => {
      const li = el('li', i === sel ? 'sel' : '');
      li.dataset.recordId = it.record_id;
      const more = [it.scenario, it.route, (it.rules || []).join(', ')].filter((x) => x);
      li.append(
        el('span', 'when', time(it.unix_ms).slice(5, 19)),
        el('span', 'tenant', it.tenant || '-'),
        el('span', 'lang', it.lang || ''),
        el('span', 'score', fmt(it.risk_score, 3) || '-'),
        el('span', 'more', more.join(' · '))
      );
      li.addEventListener('click', () => select(i));
      list.append(li);
    });
    if (!items.length) list.append(el('li', 'empty', 'Nothing waiting for review.'));
    $('queue-count').textContent = String(waiting);
    const current = list.querySelector('li.sel');
    if (current) current.scrollIntoView({ block: 'nearest' });
  }

  function meta(d) {
    const dl = el('dl', 'meta');
    const add = (k, v) => {
      if (v === null || v === undefined || v === '') return;
      dl.append(el('dt', null, k), el('dd', null, v));
    };
    add('decided', time(d.unix_ms));
    add('request id', d.request_id);
    add('tenant', d.tenant);
    add('scenario', d.scenario);
    add('route', d.route);
    add('language', d.lang);
    add('risk score', fmt(d.risk_score));
    add('OOD score', fmt(d.ood_score));
    add('decided by', d.tier);
    add('rules matched', (d.rules || []).join(', '));
    add('characters', d.text_chars);
    add('policy', d.policy_version);
    add('model', d.model && d.model.name);
    return dl;
  }

  function textSection(d) {
    const s = el('section', 'text');
    s.append(el('h3', null, 'Text'));
    if (d.text.kept) {
      s.append(el('p', 'words', d.text.value));
    } else {
      s.append(el('p', 'note', d.text.why));
      const p = el('p', 'hash');
      p.append(el('span', null, 'Keyed hash (' + d.text.mode + '): '), el('code', null, d.text.value));
      s.append(p);
    }
    if (d.text.kept && d.text.why) s.append(el('p', 'note', d.text.why));
    if (d.explainable) {
      const a = el('div', 'attributions');
      a.id = 'attributions';
      a.append(el('h3', null, 'Word attributions (cpu model, occlusion)'), el('p', 'note', 'Computing…'));
      s.append(a);
    }
    return s;
  }

  // Each word's effect on the cpu model's risk score, largest first; bars relative to the largest.
  function renderAttributions(list) {
    const box = $('attributions');
    if (!box) return;
    const table = el('table', 'attr');
    // A floor, so that a text no word moves much shows short bars, not noise at full width.
    const top = Math.max(...list.map((x) => Math.abs(x.delta)), 0.05);
    for (const x of list) {
      const tr = el('tr', x.delta >= 0 ? 'up' : 'down');
      const bar = el('div', 'bar');
      bar.style.width = Math.round((100 * Math.abs(x.delta)) / top) + '%';
      const cell = el('td', 'barcell');
      cell.append(bar);
      tr.append(el('td', 'word', x.word), el('td', 'delta', (x.delta >= 0 ? '+' : '') + x.delta.toFixed(4)), cell);
      table.append(tr);
    }
    box.replaceChildren(box.firstChild, list.length ? table : el('p', 'note', 'No attributions within the time allowed.'));
    $('item').dataset.explained = 'true';
  }

  function pathSection(d) {
    const s = el('section', 'path');
    s.append(el('h3', null, 'Path'));
    const table = el('table', 'steps');
    const head = el('tr');
    for (const h of ['tier', 'outcome', 'risk', 'rule', 'reason', 'µs']) head.append(el('th', null, h));
    table.append(head);
    for (const step of d.path || []) {
      const tr = el('tr');
      for (const v of [step.tier, step.outcome, fmt(step.risk_score), step.rule, step.reason, step.latency_us]) {
        tr.append(el('td', null, v === null || v === undefined ? '' : v));
      }
      table.append(tr);
    }
    s.append(table);
    return s;
  }

  function renderItem(d) {
    const box = $('item');
    box.replaceChildren(el('h2', null, 'Decision ' + d.record_id), meta(d), textSection(d), pathSection(d));
    box.dataset.recordId = d.record_id;
  }

  // The selected item: at once a placeholder (never the previous item's text under this one's
  // selection), then the record, then its word attributions (a model run per word).
  async function loadItem() {
    const it = items[sel];
    const box = $('item');
    const seq = ++itemSeq;
    box.dataset.recordId = '';
    box.dataset.explained = '';
    if (!it) {
      box.replaceChildren(el('p', 'empty', 'Nothing selected.'));
      return;
    }
    box.replaceChildren(el('h2', null, 'Decision ' + it.record_id), el('p', 'empty', 'Loading…'));
    const url = '/admin/review/item?record_id=' + encodeURIComponent(it.record_id);
    try {
      const d = await call(url);
      if (seq !== itemSeq) return;
      renderItem(d);
      if (!d.explainable) return;
      const e = await call(url + '&explain=true');
      if (seq === itemSeq) renderAttributions(e.attributions);
    } catch (e) {
      status(e.message, true);
    }
  }

  function select(i) {
    if (!items.length) return;
    const next = Math.max(0, Math.min(items.length - 1, i));
    if (next === sel && $('item').dataset.recordId === items[next].record_id) return;
    sel = next;
    renderQueue();
    loadItem();
  }

  async function loadQueue() {
    const started = generation;
    try {
      const q = await call('/admin/review/queue?' + filters());
      if (started !== generation) return;
      const want = items[sel] && items[sel].record_id;
      items = q.items.filter((it) => !pending.has(it.record_id));
      waiting = Math.max(q.waiting - pending.size, 0);
      const at = items.findIndex((it) => it.record_id === want);
      sel = at >= 0 ? at : Math.min(sel, Math.max(items.length - 1, 0));
      renderQueue();
      if (!items[sel] || $('item').dataset.recordId !== items[sel].record_id) loadItem();
    } catch (e) {
      status(e.message, true);
    }
  }

  async function label(truth) {
    const it = items[sel];
    if (!it) return;
    pending.add(it.record_id);
    items.splice(sel, 1);
    waiting = Math.max(waiting - 1, 0);
    if (sel >= items.length) sel = Math.max(items.length - 1, 0);
    renderQueue();
    loadItem();
    try {
      const body = await call('/admin/review/label', {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'x-tiergate-csrf': csrf },
        body: JSON.stringify({ record_id: it.record_id, label: truth }),
      });
      status('Labelled ' + truth + ': ' + it.record_id + ' (' + body.results[0].outcome + ')');
      generation += 1;
    } catch (e) {
      items.splice(Math.min(sel, items.length), 0, it);
      waiting += 1;
      renderQueue();
      status('Not labelled: ' + e.message, true);
    } finally {
      pending.delete(it.record_id);
    }
    loadQueue();
    refreshQuality();
  }

  function setText(id, v) {
    $(id).textContent = v === null || v === undefined ? '-' : String(v);
  }
  const percent = (x) => (x === null || x === undefined ? null : (100 * x).toFixed(1) + ' %');
  // The rows of the live table: the Feedback service's numbers per [feedback] window.
  const LIVE = [
    ['labelled', 'labelled', String],
    ['review_precision', 'review precision', percent],
    ['block_precision', 'block precision', percent],
    ['false_block_rate', 'false-block rate', percent],
    ['risk_allowed_rate', 'risk allowed', percent],
    ['model_ece', 'model ECE', (x) => fmt(x, 3)],
  ];
  function renderLive(live) {
    const table = $('q-live');
    if (!live) {
      $('q-refreshed').textContent = 'Not computed yet: the first refresh comes within [feedback] refresh_interval_ms.';
      return;
    }
    $('q-refreshed').textContent = 'Labelled decisions by decision time; as of ' + time(live.refreshed_ms).slice(11);
    const head = el('tr');
    head.append(el('th'));
    for (const w of live.windows) head.append(el('th', null, w.window));
    const body = el('tbody');
    for (const [key, name, show] of LIVE) {
      const tr = el('tr');
      tr.append(el('th', null, name));
      for (const w of live.windows) {
        const v = w[key];
        const td = el('td', null, v === null || v === undefined ? '-' : show(v));
        td.id = 'q-' + key + '-' + w.window;
        tr.append(td);
      }
      body.append(tr);
    }
    table.tHead.replaceChildren(head);
    table.tBodies[0].replaceWith(body);
    table.dataset.refreshedMs = String(live.refreshed_ms);
  }
  async function refreshQuality() {
    try {
      const q = await call('/admin/review/quality');
      renderLive(q.live);
      setText('q-today', q.today.labels);
      setText('q-risk', q.today.risk);
      setText('q-ok', q.today.ok);
      setText('q-mine', q.today.mine);
      setText('q-waiting', q.queue.waiting);
    } catch (e) {
      status(e.message, true);
    }
  }

  document.addEventListener('keydown', (e) => {
    if (e.target.closest('input, textarea, select') || e.ctrlKey || e.metaKey || e.altKey) return;
    const actions = {
      j: () => select(sel + 1),
      ArrowDown: () => select(sel + 1),
      k: () => select(sel - 1),
      ArrowUp: () => select(sel - 1),
      r: () => label('risk'),
      o: () => label('ok'),
    };
    const act = actions[e.key];
    if (!act) return;
    e.preventDefault();
    // A held key repeats: moving on is fine, labelling one item after another unseen is not.
    if (e.repeat && (e.key === 'r' || e.key === 'o')) return;
    act();
  });
  for (const [id, truth] of [['btn-risk', 'risk'], ['btn-ok', 'ok']]) {
    $(id).addEventListener('click', (e) => {
      e.currentTarget.blur();
      label(truth);
    });
  }
  $('filters').addEventListener('submit', (e) => {
    e.preventDefault();
    history.replaceState(null, '', '?' + filters());
    sel = 0;
    generation += 1;
    loadQueue();
  });
  $('logout').addEventListener('click', async () => {
    await fetch('/admin/console/logout', { method: 'POST', credentials: 'same-origin', headers: { 'x-tiergate-csrf': csrf } });
    location.reload();
  });

  loadQueue();
  refreshQuality();
  // The live panel, and items that arrive while the analyst works (appended: the queue is oldest first).
  setInterval(refreshQuality, 2000);
  setInterval(loadQueue, 5000);
})();
