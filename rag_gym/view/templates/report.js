"use strict";
(function () {
  const t0 = performance.now();
  const DATA = JSON.parse(document.getElementById("run-data").textContent);
  const EPISODES = DATA.episodes;
  const PASSAGES = DATA.passages || {};
  const PAGE = 50;

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") node.className = v;
      else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
      else node.setAttribute(k, v);
    }
    for (const c of children.flat(Infinity)) {
      if (c === null || c === undefined || c === false) continue;
      node.append(c instanceof Node ? c : String(c));
    }
    return node;
  }
  function fmt(v, digits) {
    if (v === null || v === undefined) return "-";
    if (typeof v === "number") {
      if (digits === undefined) return Number.isInteger(v) ? String(v) : v.toFixed(3);
      return v.toFixed(digits);
    }
    return String(v);
  }
  function isCorrect(e) { return e.answerable === false ? !!e.refused : e.em !== null && e.em >= 1; }

  // ---- run meta and tabs ----
  const p = DATA.protocol || {};
  document.getElementById("run-meta").textContent = [p.env_id, p.split, p.n !== undefined ? p.n + " questions" : null,
    p.seed !== undefined ? "seed " + p.seed : null, EPISODES.length + " episodes"].filter(Boolean).join(" · ");
  const tabs = document.querySelectorAll("#tabs button");
  function showTab(name) {
    tabs.forEach(b => b.classList.toggle("active", b.dataset.tab === name));
    document.querySelectorAll("section.tab").forEach(s => { s.hidden = s.id !== "tab-" + name; });
  }
  tabs.forEach(b => b.addEventListener("click", () => showTab(b.dataset.tab)));
  if (!DATA.train) document.querySelector('#tabs button[data-tab="training"]').hidden = true;
  if (!(DATA.leaderboard && DATA.leaderboard.rows.length)) {
    document.querySelector('#tabs button[data-tab="leaderboard"]').hidden = true;
    showTab(EPISODES.length ? "episodes" : "training");
  }
  if (!EPISODES.length) {
    document.querySelector('#tabs button[data-tab="episodes"]').hidden = true;
    document.querySelector('#tabs button[data-tab="compare"]').hidden = true;
    if (DATA.train) showTab("training");
    document.getElementById("run-meta").textContent = DATA.train && DATA.train.summary && DATA.train.summary.stage ?
      "training run · " + DATA.train.summary.stage : "training run";
  }

  // ---- leaderboard ----
  const lb = DATA.leaderboard || { columns: [], rows: [] };
  const DIGITS = { searches: 2, steps: 2, refusal_unanswerable: 2, refusal_answerable: 2, tokens: 1, bad_replies: 0, errors: 0, episodes: 0 };
  let sortKey = "em", sortDir = -1;
  function renderLeaderboard() {
    const table = document.getElementById("leaderboard");
    const head = el("tr", {}, lb.columns.map(([key, header]) => el("th", {
      "data-key": key,
      class: key === sortKey ? (sortDir > 0 ? "sorted-asc" : "sorted-desc") : null,
      onclick: () => { sortDir = key === sortKey ? -sortDir : (key === "agent" ? 1 : -1); sortKey = key; renderLeaderboard(); },
    }, header)));
    const rows = lb.rows.slice().sort((a, b) => {
      const x = a[sortKey], y = b[sortKey];
      if (x === y) return 0;
      if (x === null || x === undefined) return 1;
      if (y === null || y === undefined) return -1;
      return (x < y ? -1 : 1) * sortDir;
    });
    const body = rows.map(r => el("tr", { class: "lb-row" }, lb.columns.map(([key]) =>
      el("td", { class: key === "agent" ? null : "num" }, key === "agent" ? r[key] : fmt(r[key], DIGITS[key] === undefined ? 3 : DIGITS[key])))));
    table.replaceChildren(el("thead", {}, head), el("tbody", {}, body));
  }
  renderLeaderboard();

  // ---- episode browser ----
  const agents = [...new Set(EPISODES.map(e => e.agent))];
  const fAgent = document.getElementById("f-agent");
  agents.forEach(a => fAgent.append(el("option", { value: a }, a)));
  const fHops = document.getElementById("f-hops");
  [...new Set(EPISODES.map(e => e.hops))].sort((a, b) => a - b).forEach(h => fHops.append(el("option", { value: h }, h)));
  EPISODES.forEach((e, i) => {
    e._i = i;
    e._text = [e.question, e.prediction, (e.answers || []).join(" "), e.question_id, e.agent].join(" ").toLowerCase();
  });
  let filtered = EPISODES, page = 0, selected = null;
  function applyFilters() {
    const agent = fAgent.value, outcome = document.getElementById("f-outcome").value;
    const refused = document.getElementById("f-refused").value, ans = document.getElementById("f-answerable").value;
    const hops = fHops.value, text = document.getElementById("f-text").value.trim().toLowerCase();
    filtered = EPISODES.filter(e =>
      (!agent || e.agent === agent) &&
      (!outcome || (outcome === "correct") === isCorrect(e)) &&
      (!refused || (refused === "yes") === !!e.refused) &&
      (!ans || (ans === "answerable") === (e.answerable !== false)) &&
      (!hops || String(e.hops) === hops) &&
      (!text || e._text.includes(text)));
    page = 0;
    renderList();
  }
  document.querySelectorAll("#filters select, #filters input").forEach(x => {
    x.addEventListener("input", applyFilters);
    x.addEventListener("change", applyFilters);
  });
  function renderList() {
    const pages = Math.max(1, Math.ceil(filtered.length / PAGE));
    page = Math.min(page, pages - 1);
    document.getElementById("episode-count").textContent = filtered.length + " of " + EPISODES.length + " episodes";
    document.getElementById("episode-count").dataset.count = filtered.length;
    const pager = document.getElementById("pager");
    pager.replaceChildren(
      el("button", { type: "button", disabled: page === 0 ? "disabled" : null, onclick: () => { page--; renderList(); } }, "‹ prev"),
      " page " + (page + 1) + " / " + pages + " ",
      el("button", { type: "button", disabled: page >= pages - 1 ? "disabled" : null, onclick: () => { page++; renderList(); } }, "next ›"));
    const head = el("tr", {}, ["agent", "question", "prediction", "EM", "F1", "hops", "steps"].map(h => el("th", {}, h)));
    const rows = filtered.slice(page * PAGE, (page + 1) * PAGE).map(e => el("tr", {
      class: "episode-row" + (selected === e._i ? " selected" : ""), "data-i": e._i,
      onclick: () => showEpisode(e._i),
    }, el("td", {}, e.agent), el("td", {}, e.question || e.question_id),
       el("td", {}, e.refused ? el("span", { class: "badge" }, "refused") : (e.prediction || "-"),
         e.error ? el("span", { class: "badge bad" }, "error") : null),
       el("td", { class: "num" }, el("span", { class: "badge " + (isCorrect(e) ? "ok" : "bad") }, fmt(e.em, 2))),
       el("td", { class: "num" }, fmt(e.f1, 2)), el("td", { class: "num" }, e.hops), el("td", { class: "num" }, fmt(e.steps))));
    document.getElementById("episode-list").replaceChildren(el("thead", {}, head), el("tbody", {}, rows));
  }

  function passageBox(id, gold, extra) {
    const p = PASSAGES[id];
    return el("div", { class: "passage" + (gold ? " gold" : ""), "data-id": id, "data-gold": gold ? "1" : "0" },
      el("span", { class: "pid" }, (extra || "") + id), gold ? el("span", { class: "badge" }, "gold") : null, " ",
      p ? el("b", {}, p[0] + ": ") : null, p ? p[1] : el("i", {}, "(text not stored)"));
  }
  function renderSteps(steps, goldIds) {
    const gold = new Set(goldIds || []);
    return steps.map(s => el("div", { class: "step" },
      el("div", {}, el("span", { class: "badge " + s.action }, s.step + " · " + s.action), " ", s.text ? el("q", {}, s.text) : null,
        s.invalid ? el("span", { class: "badge bad" }, "invalid") : null),
      s.message ? el("div", { class: "hint" }, s.message) : null,
      (s.retrieved || []).map(r => passageBox(r.id, r.gold || gold.has(r.id),
        "#" + r.rank + (r.score !== null && r.score !== undefined ? " (" + fmt(r.score, 2) + ") " : " ") + (r.query ? "[" + r.query + "] " : ""))),
      el("div", { class: "terms" }, el("span", { class: "term" }, el("b", {}, "reward "), fmt(s.reward)),
        Object.entries(s.reward_terms || {}).map(([k, v]) => el("span", { class: "term", "data-term": k }, k + " " + fmt(v))),
        (s.prompt_tokens || s.completion_tokens) ? el("span", { class: "term" }, "tokens " + s.prompt_tokens + " + " + s.completion_tokens) : null),
      s.raw_output !== null && s.raw_output !== undefined ? el("details", {}, el("summary", {}, "raw model output"), el("pre", { class: "raw" }, s.raw_output)) : null));
  }
  function summaryOf(e) {
    return el("div", {},
      el("p", {}, el("b", {}, "Q: "), e.question || e.question_id),
      el("p", {}, el("b", {}, "gold: "), (e.answers || []).join(" | ") || "-", e.answerable === false ? el("span", { class: "badge" }, "unanswerable") : null),
      el("p", {}, el("b", {}, "prediction: "), e.refused ? el("span", { class: "badge" }, "refused") : (e.prediction || "-"), " ",
        el("span", { class: "badge " + (isCorrect(e) ? "ok" : "bad") }, isCorrect(e) ? "correct" : "wrong"),
        " EM " + fmt(e.em, 2) + " · F1 " + fmt(e.f1, 2) + " · reward " + fmt(e.reward, 2) + " · " + fmt(e.tokens) + " tokens"),
      healthOf(e),
      e.error ? el("p", { class: "badge bad" }, e.error) : null);
  }
  function healthOf(e) {
    const flagged = Object.entries(e.health || {}).filter(([, v]) => v === true).map(([k]) => k.replace(/_/g, " "));
    return flagged.length ? el("p", { class: "health" }, el("b", {}, "health: "), flagged.map(k => el("span", { class: "badge bad" }, k))) : null;
  }
  function stepsOrIds(e) {
    if (e.trace) return renderSteps(e.trace, e.gold_ids);
    const gold = new Set(e.gold_ids || []);
    return [el("p", { class: "hint" }, "No step trace in this run; the retrieved passages:"),
      (e.retrieved_ids || []).map((id, k) => passageBox(id, gold.has(id), "#" + (k + 1) + " "))];
  }
  function showEpisode(i) {
    selected = i;
    const e = EPISODES[i];
    document.querySelectorAll("#episode-list tr.episode-row").forEach(r => r.classList.toggle("selected", Number(r.dataset.i) === i));
    document.getElementById("episode-detail").replaceChildren(...[
      el("h2", {}, e.agent + " · " + e.question_id),
      summaryOf(e),
      el("button", { type: "button", id: "to-compare", onclick: () => { showCompare(e.question_id); showTab("compare"); } }, "this question across all agents"),
      el("h3", {}, "steps"), stepsOrIds(e)].flat(Infinity));
  }

  // ---- one question across agents ----
  const byQuestion = new Map();
  EPISODES.forEach(e => { if (!byQuestion.has(e.question_id)) byQuestion.set(e.question_id, []); byQuestion.get(e.question_id).push(e); });
  const cq = document.getElementById("compare-question");
  let compareFilled = false;
  function fillCompare() {
    if (compareFilled) return;
    compareFilled = true;
    for (const [qid, eps] of byQuestion) cq.append(el("option", { value: qid }, qid + " · " + (eps[0].question || "").slice(0, 90)));
  }
  function showCompare(qid) {
    fillCompare();
    cq.value = qid;
    const eps = byQuestion.get(qid) || [];
    document.getElementById("compare-grid").replaceChildren(...eps.map(e => el("div", { class: "agent-column", "data-agent": e.agent },
      el("h3", {}, e.agent), summaryOf(e), stepsOrIds(e))));
  }
  cq.addEventListener("change", () => showCompare(cq.value));
  document.querySelector('#tabs button[data-tab="compare"]').addEventListener("click", () => {
    if (!cq.value && byQuestion.size) showCompare(byQuestion.keys().next().value);
  });

  // ---- training ----
  if (DATA.train) {
    const tr = DATA.train;
    const sum = document.getElementById("training-summary");
    if (tr.summary && Object.keys(tr.summary).length) {
      const parts = Object.entries(tr.summary).map(([k, v]) => k + ": " + (v && typeof v === "object" ?
        Object.entries(v).map(([a, b]) => a + " " + fmt(b)).join(", ") : fmt(v)));
      sum.append(el("p", { class: "meta", id: "training-facts" }, parts.join(" · ")));
    }
    const steps = [...new Set(tr.rollouts.map(r => r.train_step))].sort((a, b) => a - b);
    const sel = document.getElementById("rollout-step");
    steps.forEach(s => sel.append(el("option", { value: s }, "step " + s)));
    function showRollouts() {
      const step = Number(sel.value);
      document.getElementById("rollouts").replaceChildren(...tr.rollouts.filter(r => r.train_step === step).map(r => el("div", { class: "rollout" },
        el("p", {}, el("b", {}, "Q: "), r.question || r.question_id || "-", " ", el("b", {}, " gold: "), (r.answers || []).join(" | "),
          r.reward !== undefined ? " · return " + fmt(r.reward, 2) : ""),
        renderSteps(r.steps, r.gold_ids))));
    }
    sel.addEventListener("change", showRollouts);
    if (steps.length) { sel.value = steps[steps.length - 1]; showRollouts(); }
    else document.getElementById("rollouts").append(el("p", { class: "hint" }, "No rollouts were sampled in this run."));
  }

  renderList();
  window.__ragGymRenderMs = performance.now() - t0;
  document.body.dataset.ready = "1";
  // the frame after the first view: when it has been painted
  requestAnimationFrame(() => setTimeout(() => { document.body.dataset.painted = String(performance.now()); }, 0));
})();
