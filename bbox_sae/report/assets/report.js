(function () {
  "use strict";
  var DATA = JSON.parse(document.getElementById("report-data").textContent);
  var FEATURES = DATA.features;
  var SVG_NS = document.getElementById("card-hist").namespaceURI;
  var state = { sortKey: null, sortDir: 1, model: "", domain: "", keptOnly: false, text: "" };
  var currentKey = null;
  var DOMAIN_ROWS = 8;

  function el(tag, cls, text) {
    var node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }
  function fixed(x, d) { return x === null || x === undefined ? "–" : x.toFixed(d); }
  function signed(x, d) { return x === null || x === undefined ? "–" : (x > 0 ? "+" : "") + x.toFixed(d); }
  function small(x) {
    if (x === null || x === undefined) return "–";
    return x !== 0 && Math.abs(x) < 1e-3 ? x.toExponential(1) : x.toFixed(3);
  }
  function ci(f) { return "[" + signed(f.ci_low, 2) + ", " + signed(f.ci_high, 2) + "]"; }

  // How each column of the feature table shows its value; the columns themselves, their order
  // and titles come from the table head the report writes (data-sort: field, data-format: a key here).
  var FORMATS = {
    "int": function (f, key) { return f[key] === null || f[key] === undefined ? "–" : f[key]; },
    "text": function (f, key) { return f[key] || ""; },
    "name": function (f, key) { return f[key] || "–"; },
    "check": function (f, key) { return f[key] ? "✓" : ""; },
    "pair": function (f) { return pairOf(f); },
    "signed": function (f, key) { return signed(f[key], 2); },
    "fixed": function (f, key) { return fixed(f[key], 2); },
    "small": function (f, key) { return small(f[key]); },
    "ci": ci
  };
  function pairOf(f) { return f.model_a + " vs " + f.model_b; }
  var COLUMNS = Array.prototype.map.call(document.querySelectorAll("#features thead th"), function (th) {
    return { key: th.dataset.sort, format: th.dataset.format, num: th.classList.contains("num"), th: th };
  });
  function value(col, f) { return col.format === "pair" ? pairOf(f) : f[col.key]; }

  function compare(col) {
    return function (x, y) {
      var a = value(col, x), b = value(col, y);
      var aMissing = a === null || a === undefined, bMissing = b === null || b === undefined;
      if (aMissing || bMissing) return aMissing === bMissing ? 0 : (aMissing ? 1 : -1);
      if (typeof a === "boolean") { a = a ? 1 : 0; b = b ? 1 : 0; }
      var c = typeof a === "number" ? a - b : String(a).localeCompare(String(b));
      return c * state.sortDir;
    };
  }

  function visible(f) {
    if (state.model && f.better_model !== state.model) return false;
    if (state.keptOnly && !f.kept) return false;
    if (state.domain && !f.domains.some(function (d) { return d.domain === state.domain; })) return false;
    if (!state.text) return true;
    var hay = ((f.label || "") + " " + (f.rule || "") + " " + (f.top_words || "") + " " + f.latent).toLowerCase();
    return hay.indexOf(state.text) >= 0;
  }

  function renderHead() {
    COLUMNS.forEach(function (col) {
      if (state.sortKey === col.key) col.th.setAttribute("aria-sort", state.sortDir > 0 ? "ascending" : "descending");
      else col.th.removeAttribute("aria-sort");
    });
  }

  function setUpSorting() {
    COLUMNS.forEach(function (col) {
      col.th.addEventListener("click", function () {
        state.sortDir = state.sortKey === col.key ? -state.sortDir : 1;
        state.sortKey = col.key;
        renderHead();
        renderRows();
      });
    });
  }

  function renderRows() {
    var rows = FEATURES.filter(visible);
    if (state.sortKey) {
      var col = COLUMNS.filter(function (c) { return c.key === state.sortKey; })[0];
      rows = rows.slice().sort(compare(col));
    }
    var tbody = document.querySelector("#features tbody");
    var fragment = document.createDocumentFragment();
    rows.forEach(function (f) {
      var tr = el("tr", "feature-row" + (f.kept ? " kept" : ""));
      tr.dataset.key = f.key;
      tr.dataset.latent = f.latent;
      tr.dataset.better = f.better_model || "";
      tr.dataset.kept = f.kept ? "true" : "false";
      tr.dataset.median = f.median_dlogp === null ? "" : String(f.median_dlogp);
      tr.tabIndex = 0;
      COLUMNS.forEach(function (col) {
        var td = el("td", (col.num ? "num " : "") + col.key, FORMATS[col.format](f, col.key));
        td.dataset.col = col.key;
        tr.appendChild(td);
      });
      tr.addEventListener("click", function () { openCard(f); });
      tr.addEventListener("keydown", function (ev) { if (ev.key === "Enter") openCard(f); });
      if (f.key === currentKey) tr.classList.add("selected");
      fragment.appendChild(tr);
    });
    tbody.replaceChildren(fragment);
    document.getElementById("row-count").textContent = rows.length + " of " + FEATURES.length + " features";
  }

  function addStat(dl, name, text) {
    dl.appendChild(el("dt", "", name));
    var dd = el("dd", "", text);
    dd.dataset.stat = name;
    dl.appendChild(dd);
  }

  function renderStats(f) {
    var dl = document.getElementById("card-stats");
    dl.replaceChildren();
    addStat(dl, "better model", f.better_model || "–");
    addStat(dl, "rule", f.rule ? f.rule + " (held-out precision " + fixed(f.rule_precision, 2) + ", recall " + fixed(f.rule_recall, 2) + ", F1 " + fixed(f.rule_f1, 2) + ")" : "–");
    addStat(dl, "median Δlog p", signed(f.median_dlogp, 3) + " " + ci(f));
    addStat(dl, "mean Δlog p", signed(f.mean_dlogp, 3));
    addStat(dl, "median Δp", signed(f.median_dp, 3));
    addStat(dl, "q-value", small(f.q_value));
    addStat(dl, "p-value", small(f.p_value));
    addStat(dl, "consistency", fixed(f.consistency, 2));
    addStat(dl, "holdout", signed(f.holdout_median_dlogp, 3) + " median Δlog p over " + (f.holdout_n === null ? "–" : f.holdout_n) + " words" + (f.generalizes ? " (generalizes)" : ""));
    addStat(dl, "top words", (f.n_top === null ? "–" : f.n_top) + ": " + (f.top_words || ""));
    addStat(dl, "density", small(f.density));
    addStat(dl, "coherence", fixed(f.coherence, 3));
    addStat(dl, "source", f.source);
  }

  function svg(tag, attrs, text) {
    var node = document.createElementNS(SVG_NS, tag);
    Object.keys(attrs).forEach(function (k) { node.setAttribute(k, attrs[k]); });
    if (text !== undefined) node.textContent = String(text);
    return node;
  }

  function renderHistogram(f) {
    var root = document.getElementById("card-hist");
    var caption = document.getElementById("card-hist-caption");
    root.replaceChildren();
    if (!f.hist) { caption.textContent = "No top words with both models' log-probs."; return; }
    var W = 360, H = 140, P = 22, edges = f.hist.edges, counts = f.hist.counts;
    var lo = edges[0], hi = edges[edges.length - 1], span = hi - lo || 1, top = Math.max.apply(null, counts) || 1;
    function x(v) { return P + (v - lo) / span * (W - 2 * P); }
    counts.forEach(function (c, i) {
      var h = c / top * (H - 2 * P), centre = (edges[i] + edges[i + 1]) / 2;
      var bar = svg("rect", { x: x(edges[i]), y: H - P - h, width: Math.max(1, x(edges[i + 1]) - x(edges[i]) - 1), height: h,
        "class": centre >= 0 ? "bar-pos" : "bar-neg", "data-count": c });
      bar.appendChild(svg("title", {}, "[" + edges[i].toFixed(2) + ", " + edges[i + 1].toFixed(2) + "): " + c));
      root.appendChild(bar);
    });
    if (lo < 0 && hi > 0) root.appendChild(svg("line", { x1: x(0), x2: x(0), y1: P / 2, y2: H - P, "class": "zero" }));
    root.appendChild(svg("text", { x: P, y: H - 6, "class": "axis", "text-anchor": "start" }, lo.toFixed(2)));
    root.appendChild(svg("text", { x: W - P, y: H - 6, "class": "axis", "text-anchor": "end" }, hi.toFixed(2)));
    root.appendChild(svg("text", { x: W / 2, y: 12, "class": "axis", "text-anchor": "middle" }, "tallest bar: " + top + " words"));
    caption.textContent = "Δlog p = log p(" + f.model_a + ") − log p(" + f.model_b + ") over the top words; right of 0: " + f.model_a + " better.";
  }

  function renderDomains(f) {
    var section = document.getElementById("card-domains");
    section.hidden = !DATA.domains.length;
    var tbody = document.querySelector("#card-domain-table tbody");
    tbody.replaceChildren();
    // Keep the table small: the domains with most words, plus the one filtered on.
    var listed = f.domains.filter(function (d, i) { return i < DOMAIN_ROWS || d.domain === state.domain; });
    listed.forEach(function (d) {
      var tr = el("tr", d.domain === state.domain ? "filtered" : "");
      tr.dataset.domain = d.domain;
      tr.dataset.holds = d.holds === null ? "" : String(d.holds);
      tr.appendChild(el("td", "", d.domain));
      tr.appendChild(el("td", "num", d.n));
      tr.appendChild(el("td", "num", signed(d.median_dlogp, 2)));
      tr.appendChild(el("td", "num", d.wins === null ? "–" : Math.round(d.wins * 100) + "%"));
      tr.appendChild(el("td", d.holds === null ? "holds-few" : d.holds ? "holds-yes" : "holds-no",
        d.holds === null ? "too few" : d.holds ? "yes" : "no"));
      tbody.appendChild(tr);
    });
    var rest = f.domains.filter(function (d) { return listed.indexOf(d) < 0; });
    if (rest.length) {
      var words = rest.reduce(function (sum, d) { return sum + d.n; }, 0);
      var more = el("tr", "more-domains");
      var cell = el("td", "", "… " + rest.length + " more domains (" + words + " words)");
      cell.colSpan = 5;
      more.appendChild(cell);
      tbody.appendChild(more);
    }
    var held = f.domains.filter(function (d) { return d.holds === true; }).length;
    var judged = f.domains.filter(function (d) { return d.holds !== null; }).length;
    document.getElementById("card-domain-caption").textContent = f.domains.length
      ? "Top words of both splits by document domain; holds: the domain's median Δ has the sign of the whole (" + held + " of " + judged + " domains with enough words)."
      : "No top words with both models' log-probs.";
  }

  function probSpan(model, lp) {
    var span = el("span", "prob");
    span.dataset.model = model;
    var p = lp === null ? null : Math.exp(lp);
    if (p !== null) span.dataset.prob = String(p);
    span.appendChild(el("b", "prob-model", model));
    span.appendChild(document.createTextNode(" p="));
    span.appendChild(el("span", "prob-value", p === null ? "n/a" : p.toPrecision(3)));
    return span;
  }

  function renderContexts(listId, f, contexts) {
    var list = document.getElementById(listId);
    list.replaceChildren();
    if (!contexts.length) { list.appendChild(el("li", "empty", "none")); return; }
    contexts.forEach(function (c) {
      var li = el("li", "context" + (c.in_top ? "" : " not-top"));
      li.dataset.docId = c.doc_id;
      li.dataset.wordIdx = c.word_idx;
      li.dataset.inTop = c.in_top ? "true" : "false";
      var text = el("p", "ctx-text");
      text.appendChild(el("span", "left", c.left));
      text.appendChild(el("mark", "target", c.word));
      text.appendChild(el("span", "right", c.right));
      li.appendChild(text);
      var meta = el("p", "ctx-meta");
      meta.appendChild(probSpan(f.model_a, c.logprob[0]));
      meta.appendChild(probSpan(f.model_b, c.logprob[1]));
      var d = c.logprob[0] === null || c.logprob[1] === null ? null : c.logprob[0] - c.logprob[1];
      meta.appendChild(el("span", "delta", "Δlog p " + signed(d, 2)));
      meta.appendChild(el("span", "doc", c.doc_id + (c.domain ? " · " + c.domain : "") + " · act " + fixed(c.activation, 2)));
      li.appendChild(meta);
      list.appendChild(li);
    });
  }

  function renderFindings(f) {
    var refs = f.finding_refs || [];
    var p = document.getElementById("card-findings");
    p.replaceChildren();
    p.hidden = !refs.length;
    if (refs.length) p.appendChild(document.createTextNode(refs.length > 1 ? "Findings: " : "Finding: "));
    refs.forEach(function (r, i) {
      if (i) p.appendChild(document.createTextNode(", "));
      var a = el("a", "finding-link", "finding " + r.finding + ": " + (r.statement || "") + " (" + r.better_model + " better)");
      a.href = "#finding-" + r.finding;
      p.appendChild(a);
    });
    var reason = document.getElementById("card-kept-reason");
    reason.textContent = f.kept_reason || "";
    reason.hidden = !f.kept_reason;
  }

  function openCard(f) {
    currentKey = f.key;
    var card = document.getElementById("feature-card");
    card.dataset.key = f.key;
    card.dataset.latent = f.latent;
    document.getElementById("card-title").textContent = "Latent " + f.latent + " · " + f.model_a + " vs " + f.model_b;
    document.getElementById("card-label").textContent = f.label || "(unlabeled)";
    document.getElementById("card-label-source").textContent = (f.label_source || "unlabeled") + (f.label_reason ? " (" + f.label_reason + ")" : "");
    document.getElementById("card-label-score").textContent = DATA.scores
      .filter(function (s) { return f[s[0]] !== null && f[s[0]] !== undefined; })
      .map(function (s) { return s[1] + " score " + f[s[0]].toFixed(2); }).join(" · ");
    renderFindings(f);
    renderStats(f);
    renderHistogram(f);
    renderDomains(f);
    ["train", "holdout"].forEach(function (split) {
      renderContexts("card-" + split, f, f.contexts[split]);
      var shown = f.contexts[split].length, total = f.context_counts[split];
      document.getElementById("card-" + split + "-count").textContent = shown < total ? "(" + shown + " of " + total + ")" : "(" + total + ")";
    });
    card.hidden = false;
    document.querySelectorAll("#features tr.feature-row").forEach(function (tr) {
      tr.classList.toggle("selected", tr.dataset.key === f.key);
    });
    history.replaceState(null, "", "#" + encodeURIComponent(f.key));
  }

  function setUpControls() {
    var select = document.getElementById("filter-model");
    DATA.models.forEach(function (m) { var o = el("option", "", m); o.value = m; select.appendChild(o); });
    select.addEventListener("change", function () { state.model = select.value; renderRows(); });
    var domain = document.getElementById("filter-domain");
    DATA.domains.forEach(function (d) { var o = el("option", "", d); o.value = d; domain.appendChild(o); });
    document.getElementById("filter-domain-label").hidden = !DATA.domains.length;
    domain.addEventListener("change", function () {
      state.domain = domain.value;
      renderRows();
      FEATURES.forEach(function (f) { if (f.key === currentKey) renderDomains(f); });
    });
    var kept = document.getElementById("filter-kept");
    kept.addEventListener("change", function () { state.keptOnly = kept.checked; renderRows(); });
    var text = document.getElementById("filter-text");
    text.addEventListener("input", function () { state.text = text.value.trim().toLowerCase(); renderRows(); });
    document.getElementById("card-close").addEventListener("click", function () {
      document.getElementById("feature-card").hidden = true;
    });
  }

  // A server-rendered table sorts by a header's column: a cell's data-value (numbers) or its text.
  // Clicking the same header again reverses the order; missing values go last either way.
  function cellValue(td) {
    if (td.dataset.value !== undefined) {
      var v = parseFloat(td.dataset.value);
      return isNaN(v) ? null : v;
    }
    return td.textContent;
  }
  function sortableHead(table, sortRows) {
    var sortState = { index: -1, dir: 1 };
    table.querySelectorAll("thead th").forEach(function (th, index) {
      th.addEventListener("click", function () {
        sortState.dir = sortState.index === index ? -sortState.dir : 1;
        sortState.index = index;
        table.querySelectorAll("thead th").forEach(function (other) { other.removeAttribute("aria-sort"); });
        th.setAttribute("aria-sort", sortState.dir > 0 ? "ascending" : "descending");
        sortRows(th.dataset.sort, index, sortState.dir);
      });
    });
  }
  function byValue(get, dir) {
    return function (x, y) {
      var a = get(x), b = get(y);
      if (a === null || b === null) return a === b ? 0 : (a === null ? 1 : -1);
      return (typeof a === "number" ? a - b : String(a).localeCompare(String(b))) * dir;
    };
  }

  function setUpFindingsTable() {
    var table = document.getElementById("findings-table");
    if (!table) return;
    var tbody = table.querySelector("tbody");
    var rows = Array.prototype.slice.call(tbody.querySelectorAll("tr.finding-row"));
    var model = document.getElementById("findings-filter-model");
    var kind = document.getElementById("findings-filter-kind");
    var text = document.getElementById("findings-filter-text");
    function filter() {
      var needle = text.value.trim().toLowerCase(), shown = 0;
      rows.forEach(function (tr) {
        var show = (!model.value || tr.dataset.better === model.value) && (!kind.value || tr.dataset.kind === kind.value)
          && (!needle || tr.dataset.search.indexOf(needle) >= 0);
        tr.hidden = !show;
        if (show) shown += 1;
      });
      document.getElementById("findings-row-count").textContent = shown + " of " + rows.length + " findings";
    }
    sortableHead(table, function (key, index, dir) {
      rows.sort(byValue(function (tr) { return cellValue(tr.children[index]); }, dir));
      rows.forEach(function (tr) { tbody.appendChild(tr); });
    });
    [model, kind].forEach(function (node) { node.addEventListener("change", filter); });
    text.addEventListener("input", filter);
    filter();
  }

  // A finding's panel: every held-out word in its passage, shaded by Δ towards the model it
  // favours (the finding's winner's colour for its own words, the other's for counter-examples).
  var WORD_FIELDS = { delta: 0, lp_a: 1, lp_b: 2, domain: 3, text: 4 };
  // Line breaks shown as ⏎, as the findings' contexts show them: a finding may be about one.
  function oneLine(text) { return String(text || "").replace(/\n/g, "⏎"); }
  function renderWordRow(row, winnerIsA) {
    var delta = row[0], counter = delta !== null && (winnerIsA ? delta < 0 : delta > 0);
    var tr = el("tr", "finding-word" + (counter ? " counter" : ""));
    tr.dataset.delta = delta === null ? "" : String(delta);
    tr.dataset.docId = row[7];
    tr.appendChild(el("td", "num delta", signed(delta, 2)));
    tr.appendChild(el("td", "num", fixed(row[1], 2)));
    tr.appendChild(el("td", "num", fixed(row[2], 2)));
    tr.appendChild(el("td", "domain", row[3] || "–"));
    var passage = el("td", "passage");
    passage.appendChild(el("span", "left", oneLine(row[4])));
    var mark = el("mark", "target", oneLine(row[5]));
    var strength = delta === null ? 0 : Math.min(1, Math.abs(delta) / 4);
    mark.style.background = delta === null ? "#eee" : (delta > 0 ? "rgba(43,108,176," : "rgba(192,86,33,") + (0.15 + 0.6 * strength).toFixed(2) + ")";
    passage.appendChild(mark);
    passage.appendChild(el("span", "right", oneLine(row[6])));
    tr.appendChild(passage);
    // What each model expected there instead, when its scores kept it.
    tr.appendChild(el("td", "expected", row[8] || "–"));
    tr.appendChild(el("td", "expected", row[9] || "–"));
    return tr;
  }
  function setUpFindingPanels() {
    document.querySelectorAll("details.finding-words").forEach(function (details) {
      var table = details.querySelector("table");
      var rows = (DATA.finding_words[details.dataset.finding] || []).slice();
      var winnerIsA = details.dataset.winner === "a";
      function render() {
        var fragment = document.createDocumentFragment();
        rows.forEach(function (row) { fragment.appendChild(renderWordRow(row, winnerIsA)); });
        table.querySelector("tbody").replaceChildren(fragment);
      }
      sortableHead(table, function (key, index, dir) {
        var field = WORD_FIELDS[key];
        rows.sort(byValue(function (row) { return key === "text" ? row[4] + row[5] + row[6] : row[field]; }, dir));
        render();
      });
      // Rendered when first opened: a run's panels hold thousands of rows a reader may never open.
      details.addEventListener("toggle", function () { if (details.open && !table.querySelector("tbody tr")) render(); });
    });
  }

  setUpFindingsTable();
  setUpFindingPanels();
  setUpControls();
  setUpSorting();
  renderHead();
  renderRows();
  // A finding's member links (#<feature key>) open that latent's card, on load and on click.
  function openLinked() {
    var linked = decodeURIComponent(location.hash.slice(1));
    var match = FEATURES.filter(function (f) { return f.key === linked; })[0];
    if (!match) return false;
    openCard(match);
    return true;
  }
  openLinked();
  window.addEventListener("hashchange", function () {
    if (openLinked()) document.getElementById("feature-card").scrollIntoView({ block: "start" });
  });
})();
