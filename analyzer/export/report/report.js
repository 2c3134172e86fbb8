// gpuheap report: renders the data embedded in the page (script#gpuheap-data, JSON written by
// analyzer/report_html.cpp) as timelines (uPlot), icicle flame graphs (canvas) and tables.
// Every string from the trace reaches the page through textContent or canvas fillText,
// never as markup. When done, body[data-status] and the title say "ok" (or the error), which
// the headless-browser test reads.
(function () {
  'use strict';
  var t0 = performance.now();
  var statusEl = document.getElementById('status');
  function fail(msg) {
    document.title = 'gpuheap report: error';
    document.body.setAttribute('data-status', 'error');
    statusEl.textContent = 'error: ' + msg;
  }
  window.addEventListener('error', function (e) { fail(e.message + ' (' + e.filename + ':' + e.lineno + ')'); });

  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  var UNITS = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];
  function bytes(v) {
    if (v === null || v === undefined) return '-';
    var a = Math.abs(v), i = 0;
    while (a >= 1024 && i < UNITS.length - 1) { a /= 1024; i++; }
    return (v < 0 ? '-' : '') + (i === 0 ? a.toFixed(0) : a.toFixed(2)) + ' ' + UNITS[i];
  }
  // The byte axis steps by powers of two and labels each tick in the step's unit, so ticks
  // read 64 MiB, 128 MiB, ... (decimal steps read 95.37 MiB, 190.73 MiB in binary units).
  var BIN_INCRS = [];
  for (var p2 = 1; p2 <= Math.pow(2, 60); p2 *= 2) BIN_INCRS.push(p2);
  function binaryTicks(u, vals, axisIdx, space, incr) {
    var i = 0;
    while (i < UNITS.length - 1 && incr >= Math.pow(1024, i + 1)) i++;
    var labels = vals.map(function (v) {
      return v === null ? '' : (v / Math.pow(1024, i)).toFixed(0) + ' ' + UNITS[i];
    });
    u.root.setAttribute('data-yticks', labels.join('|'));  // what the canvas shows, for tests
    return labels;
  }
  function count(v) { return String(v); }
  function seconds(v) { return v === null || v === undefined ? '-' : v.toFixed(6) + ' s'; }
  var tip = el('div', 'tip');
  document.body.appendChild(tip);
  function showTip(ev, text) {
    tip.textContent = text;
    tip.style.display = 'block';
    tip.style.left = Math.min(ev.clientX + 14, window.innerWidth - 660) + 'px';
    tip.style.top = (ev.clientY + 14) + 'px';
  }
  function hideTip() { tip.style.display = 'none'; }

  var D = JSON.parse(document.getElementById('gpuheap-data').textContent);
  var drawn = { series: 0, rects: 0, markers: 0, spans: 0, areas: 0 };
  // uPlot draws asynchronously: the status is written once every chart has drawn (and the
  // rest of the page was built), so "ok" means the timelines are on screen.
  var pendingCharts = D.timelines.length, built = false;
  function finish() {
    if (!built || pendingCharts > 0 || document.body.getAttribute('data-status') === 'error') return;
    document.body.setAttribute('data-status', 'ok');
    // Time from the script's start to every chart drawn (bench/results: report-*.json).
    document.body.setAttribute('data-render-ms', String(Math.round(performance.now() - t0)));
    document.title = 'gpuheap report: ok';
    if (location.hash === '#selftest') setTimeout(selftest, 0);  // outside uPlot's draw hook
    // What was drawn is for tests and benchmarks (data-drawn), not for the reader: the
    // visible status line goes away once the page is built.
    document.body.setAttribute('data-drawn', D.timelines.length + ' timelines, ' + drawn.series + ' series, ' +
      drawn.markers + ' markers, ' + D.flames.length + ' flame graphs, ' + drawn.rects + ' frames drawn, ' +
      drawn.spans + ' phase spans, ' + drawn.areas + ' category areas');
    statusEl.textContent = '';
    statusEl.hidden = true;
  }

  // ---- meta ----
  var meta = document.getElementById('meta');
  D.traces.forEach(function (t) {
    meta.appendChild(el('div', null, (t.rank !== null && t.rank !== undefined ? 'rank ' + t.rank + ', ' : '') +
      'pid ' + t.pid + ' on ' + t.host + ': ' + t.command + '  (' + t.events +
      ' events, ' + seconds(t.duration_ns / 1e9) + ', ' + t.path + ')'));
  });

  // ---- timelines ----
  var COLORS = { requested: '#1f77b4', allocated: '#2ca02c', active: '#ff7f0e', reserved: '#d62728' };
  // Opaque pastels: each area paints over the ones above it, and the lines stay readable on them.
  var CATEGORY_COLORS = { parameter: '#aec7e8', gradient: '#ffbb78', optimizer_state: '#98df8a',
    activation: '#ff9896', temporary: '#c5b0d5', library: '#c49c94', framework_cache: '#f7b6d2',
    other: '#c7c7c7', unknown: '#e8e8e8' };
  var MARK = { peak: '#8250df', oom: '#cf222e', phase: '#0969da' };
  var SPAN = ['rgba(9,105,218,0.08)', 'rgba(26,127,55,0.10)', 'rgba(154,103,0,0.10)'];
  function timeline(tl, parent) {
    parent.appendChild(el('h3', null, tl.label));
    var box = el('div', 'chart');
    parent.appendChild(box);
    var series = [{ label: 'time', value: function (u, v) { return seconds(v); } }];
    var data = [tl.t];
    categoryAreas(tl, series, data);
    ['requested', 'allocated', 'active', 'reserved'].forEach(function (k) {
      if (!tl[k]) return;
      series.push({ label: k, stroke: COLORS[k], width: 1.5,
        paths: uPlot.paths && uPlot.paths.stepped ? uPlot.paths.stepped({ align: 1 }) : undefined,
        value: function (u, v) { return bytes(v); } });
      data.push(tl[k]);
      drawn.series++;
    });
    var first = true;
    var spans = tl.spans || [];
    function drawMarkers(u) {
      var ctx = u.ctx, top = u.bbox.top, h = u.bbox.height;
      ctx.save();
      ctx.font = (11 * devicePixelRatio) + 'px sans-serif';
      // Phase ranges: shaded spans, nested ones in their own colour, names at the bottom
      // (canvas text: a name from the trace is never markup).
      spans.forEach(function (s) {
        var x0 = Math.max(u.valToPos(s.t0, 'x', true), u.bbox.left);
        var x1 = Math.min(u.valToPos(s.t1, 'x', true), u.bbox.left + u.bbox.width);
        if (x1 < x0) return;
        ctx.fillStyle = SPAN[s.depth % SPAN.length];
        ctx.fillRect(x0, top, Math.max(x1 - x0, 1), h);
        if (x1 - x0 > 30 * devicePixelRatio) {
          ctx.fillStyle = '#57606a';
          ctx.fillText(s.label, x0 + 2 * devicePixelRatio, top + h - (4 + 12 * (s.depth % 4)) * devicePixelRatio);
        }
      });
      tl.markers.forEach(function (m, i) {
        var x = u.valToPos(m.t, 'x', true);
        if (x < u.bbox.left || x > u.bbox.left + u.bbox.width) return;
        ctx.strokeStyle = ctx.fillStyle = MARK[m.kind] || '#57606a';
        ctx.setLineDash([4 * devicePixelRatio, 3 * devicePixelRatio]);
        ctx.beginPath();
        ctx.moveTo(x, top);
        ctx.lineTo(x, top + h);
        ctx.stroke();
        ctx.fillText(m.label, x + 3 * devicePixelRatio, top + (12 + 12 * (i % 3)) * devicePixelRatio);
      });
      ctx.restore();
      if (first) {
        first = false;
        drawn.markers += tl.markers.length;
        drawn.spans += spans.length;
        pendingCharts--;
        finish();
      }
    }
    var width = Math.max(600, (parent.clientWidth || 1000) - 10);
    var u = new uPlot({
      width: width, height: 300, series: series,
      scales: { x: { time: false } },
      axes: [{ label: D.time_axis ? 'seconds since the earliest process start' : 'seconds since start', values: function (u, vals) { return vals.map(function (v) { return v.toFixed(3); }); } },
             { size: 90, incrs: BIN_INCRS, values: binaryTicks }],
      cursor: { drag: { x: true, y: false } },
      hooks: { draw: [drawMarkers] }
    }, data, box);
    // Several processes: every chart opens on the same time range, so their peaks line up.
    if (D.time_axis && D.time_axis.max > D.time_axis.min) u.setScale('x', { min: D.time_axis.min, max: D.time_axis.max });
    if (spans.length || tl.phase_names) {
      box.appendChild(el('div', 'hint phases', 'Phases (shaded ranges, blue lines for marks): ' +
        (tl.phase_names || []).join(', ') + (tl.phases_left_out ? ' (' + tl.phases_left_out + ' instances not drawn)' : '')));
    }
    box.appendChild(el('div', 'hint', 'Drag to zoom into a time range, double-click to zoom out. Values are the ' +
      'maximum of each ' + seconds(tl.bucket_s) + ' bucket (' + tl.t.length + ' points; peaks are exact).'));
    if (tl.categories) {
      box.appendChild(el('div', 'hint categories', 'Areas: the requested bytes by category at each point (' +
        tl.categories.names.join(', ') + '), every allocation in its final category (docs/categories.md); ' +
        'they add up to the requested line.' + (tl.categories.undecided ? ' ' + tl.categories.undecided +
        (tl.categories.undecided === 1 ? ' process on this GPU decided no category: what it holds is unknown.'
          : ' processes on this GPU decided no category: what they hold is unknown.') : '')));
    }
    return u;
  }
  // Live requested bytes by category (docs/categories.md), stacked under the lines: each area
  // is drawn as the sum of its category and those below it, topmost first so that the lower
  // ones paint over it; the legend and the cursor read each category's own bytes. At every
  // point they sum to `requested` (the moment of that bucket's maximum).
  function categoryAreas(tl, series, data) {
    var c = tl.categories;
    if (!c) return;
    var sums = [], acc = tl.t.map(function () { return 0; });
    c.bytes.forEach(function (v) {
      acc = acc.map(function (a, i) { return a + v[i]; });
      sums.push(acc);
    });
    for (var k = c.names.length - 1; k >= 0; k--) {
      var raw = c.bytes[k], col = CATEGORY_COLORS[c.names[k]] || '#8c8c8c';
      series.push({ label: c.names[k], stroke: col, width: 0.5, fill: col,
        paths: uPlot.paths && uPlot.paths.stepped ? uPlot.paths.stepped({ align: 1 }) : undefined,
        value: (function (raw) {
          return function (u, v, si, i) { return i === null || i === undefined ? '-' : bytes(raw[i]); };
        })(raw) });
      data.push(sums[k]);
      drawn.areas++;
    }
  }
  var tlBox = document.getElementById('timelines');
  if (!D.timelines.length) tlBox.appendChild(el('p', null, 'No device memory events in the trace.'));
  var charts = D.timelines.map(function (t) { return timeline(t, tlBox); });

  // ---- flame graphs (icicle: callers on top, callees below) ----
  var ROW = 18;
  function hue(s) {
    var h = 0;
    for (var i = 0; i < s.length; i++) h = (h * 31 + s.charCodeAt(i)) >>> 0;
    return h;
  }
  function Flame(f, parent) {
    var n = f.nodes.length, name = [], file = [], line = [], value = [], par = [], kids = [], depth = [], cat = [];
    for (var i = 0; i < n; i++) {
      var r = f.nodes[i];
      name.push(f.names[r[0]]); file.push(f.names[r[1]]); line.push(r[2]); value.push(r[3]); par.push(r[4]);
      cat.push(r[5]);
      kids.push([]);
      depth.push(i === 0 ? 0 : depth[r[4]] + 1);
      if (i) kids[r[4]].push(i);
    }
    var fmt = f.unit === 'bytes' ? bytes : count;
    parent.appendChild(el('h3', null, f.title + ' — ' + fmt(f.total) + (f.capped ? ' (smallest frames merged: ' + f.capped + ')' : '')));
    var bar = el('div', 'flame-bar');
    var input = el('input');
    input.type = 'search';
    input.placeholder = 'search function / file';
    var found = el('span', 'hint');
    var crumbs = el('span');
    // The category filter: a node's bytes of category k are its own (cat[i], see
    // report_html.cpp own_categories) and its children's, summed up from the leaves (a child
    // always comes after its parent).
    var all = value, own = value.slice();
    for (var j = 1; j < n; j++) own[par[j]] -= value[j];
    function inCategory(k) {
      var v = [];
      for (var i = 0; i < n; i++) v.push(0);
      for (i = n - 1; i >= 0; i--) {
        var c = cat[i];
        if (typeof c === 'number') { if (c === k) v[i] += own[i]; }
        else if (c) for (var q = 0; q < c.length; q += 2) if (c[q] === k) v[i] += c[q + 1];
        if (i) v[par[i]] += v[i];
      }
      return v;
    }
    var select = f.by_category ? categorySelect(f, inCategory) : null;
    if (select) bar.appendChild(select);
    bar.appendChild(input); bar.appendChild(found); bar.appendChild(crumbs);
    parent.appendChild(bar);
    var box = el('div', 'flame-box');
    var canvas = el('canvas');
    box.appendChild(canvas);
    parent.appendChild(box);
    var root = 0, query = '', rects = [];
    function matches(i) {
      return query && (name[i].toLowerCase().indexOf(query) >= 0 || file[i].toLowerCase().indexOf(query) >= 0);
    }
    function maxDepth(i) {
      var d = 0, st = [[i, 0]];
      while (st.length) {
        var p = st.pop();
        if (p[1] > d) d = p[1];
        kids[p[0]].forEach(function (c) { if (value[c]) st.push([c, p[1] + 1]); });
      }
      return d;
    }
    function draw() {
      var dpr = window.devicePixelRatio || 1, w = box.clientWidth || 1000;
      var rows = maxDepth(root) + 1;
      canvas.style.height = (rows * ROW) + 'px';
      canvas.width = w * dpr;
      canvas.height = rows * ROW * dpr;
      var ctx = canvas.getContext('2d');
      ctx.scale(dpr, dpr);
      ctx.font = '11px sans-serif';
      ctx.textBaseline = 'middle';
      rects = [];
      var matched = 0;
      var st = [[root, 0, w, 0, false]];
      while (st.length) {
        var p = st.pop(), i = p[0], x = p[1], width = p[2], d = p[3], inMatch = p[4];
        if (width < 0.5) continue;
        var m = matches(i);
        if (m && !inMatch) matched += value[i];
        var h = hue(name[i]);
        ctx.fillStyle = query ? (m ? '#e040a0' : 'hsl(' + (h % 40 + 20) + ',20%,' + (75 + h % 10) + '%)')
                              : 'hsl(' + (h % 40 + 15) + ',' + (70 + h % 25) + '%,' + (55 + h % 15) + '%)';
        ctx.fillRect(x, d * ROW, Math.max(width - 1, 0.5), ROW - 1);
        rects.push([x, d * ROW, width, i]);
        if (width > 30) {
          ctx.fillStyle = '#1b1f24';
          var label = name[i], maxc = Math.floor((width - 6) / 6.2);
          if (label.length > maxc) label = label.slice(0, Math.max(maxc - 1, 1)) + '…';
          ctx.fillText(label, x + 3, d * ROW + ROW / 2);
        }
        var cx = x, total = value[i] || 1;
        kids[i].forEach(function (c) {
          var cw = width * value[c] / total;
          st.push([c, cx, cw, d + 1, inMatch || m]);
          cx += cw;
        });
      }
      drawn.rects += rects.length;
      found.textContent = query ? 'matched ' + fmt(matched) + ' (' + (100 * matched / (value[0] || 1)).toFixed(1) + '% of all)' : '';
      while (crumbs.firstChild) crumbs.removeChild(crumbs.firstChild);
      var path = [];
      for (var a = root; ; a = par[a]) { path.unshift(a); if (a === 0) break; }
      path.forEach(function (a, k) {
        var c = el('span', 'crumb', (k ? ' › ' : '') + name[a]);
        c.addEventListener('click', function () { root = a; draw(); });
        crumbs.appendChild(c);
      });
    }
    function hit(ev) {
      var b = canvas.getBoundingClientRect(), x = ev.clientX - b.left, y = ev.clientY - b.top;
      for (var k = 0; k < rects.length; k++) {
        var r = rects[k];
        if (x >= r[0] && x < r[0] + r[2] && y >= r[1] && y < r[1] + ROW) return r[3];
      }
      return -1;
    }
    canvas.addEventListener('mousemove', function (ev) {
      var i = hit(ev);
      if (i < 0) return hideTip();
      showTip(ev, name[i] + (file[i] ? '\n' + file[i] + (line[i] ? ':' + line[i] : '') : '') + '\n' + fmt(value[i]) +
        ' (' + (100 * value[i] / (value[0] || 1)).toFixed(2) + '% of all, ' +
        (100 * value[i] / (value[root] || 1)).toFixed(2) + '% of the zoomed frame)');
    });
    canvas.addEventListener('mouseleave', hideTip);
    canvas.addEventListener('click', function (ev) {
      var i = hit(ev);
      if (i < 0) return;
      root = (i === root && i !== 0) ? par[i] : i;
      draw();
    });
    input.addEventListener('input', function () { query = input.value.trim().toLowerCase(); draw(); });
    // The category filter: each node's value in that category (docs/categories.md), the
    // frames without any left out; the zoom starts again from the top.
    if (select) select.addEventListener('change', function () {
      value = select.value === '' ? all : inCategory(Number(select.value));
      root = 0;
      draw();
    });
    window.addEventListener('resize', draw);
    draw();
    return { canvas: canvas, input: input, found: found, rects: function () { return rects; },
             root: function () { return root; }, name: name, select: select,
             total: function () { return value[0]; } };
  }
  // A flame graph's category filter: every category with bytes in it (inCategory(k)[0]: the
  // root's bytes of category k, an index of D.category_names).
  function categorySelect(f, inCategory) {
    if (!D.category_names) return null;
    var select = el('select', 'flame-category');
    var opt = el('option', null, 'all categories');
    opt.value = '';
    select.appendChild(opt);
    D.category_names.forEach(function (nm, k) {
      var v = inCategory(k)[0];
      if (!v) return;
      var o = el('option', null, nm + ' (' + (f.unit === 'bytes' ? bytes(v) : v) + ')');
      o.value = String(k);
      select.appendChild(o);
    });
    return select;
  }
  var flBox = document.getElementById('flames');
  var flames = [];
  D.flames.forEach(function (f) {
    if (!f.total) { flBox.appendChild(el('h3', null, f.title + ': none')); return; }
    flames.push(Flame(f, flBox));
  });

  // ---- tables (from the summary's JSON) ----
  var tbBox = document.getElementById('tables');
  function table(head, rows) {
    var t = el('table'), tr = el('tr');
    head.forEach(function (h) { tr.appendChild(el('th', h[1] ? 'l' : null, h[0])); });
    t.appendChild(tr);
    rows.forEach(function (r) {
      var row = el('tr');
      r.forEach(function (c, k) {
        var td = el('td', head[k][1] || null, c instanceof Node ? null : c);
        if (c instanceof Node) td.appendChild(c);
        row.appendChild(td);
      });
      t.appendChild(row);
    });
    return t;
  }
  function frameText(f) {
    var s = f.function || (f.module ? f.module.split('/').pop() + '+0x' + (f.offset || 0).toString(16) : f.ip);
    if (f.file) s += '  (' + f.file + (f.line ? ':' + f.line : '') + ')';
    return s;
  }
  // A C++ label with its template arguments elided, as the text summary's default view has
  // it (analyzer/labels.cpp short_name); the whole name is the cell's tooltip.
  // With the line, as the text has it ("Block.forward (torch_job.py:49)"): sites of one
  // function on different lines must not read the same.
  function siteCell(s) {
    var full = s.label || '', f = s.stack && s.label_frame !== undefined ? s.stack[s.label_frame] : null;
    var out = '', depth = 0;
    var at = f && f.file && f.function ? ' (' + f.file.split('/').pop() + (f.line ? ':' + f.line : '') + ')' : '';
    if (!f || f.module === 'python') return full + at;
    for (var i = 0; i < full.length; ++i) {
      var c = full[i];
      if (depth === 0 && c === '<' && /operator$/.test(out)) {
        while (i < full.length && '<=>'.indexOf(full[i]) >= 0) out += full[i++];
        --i;
      } else if (c === '<') {
        if (depth++ === 0) out += '<...>';
      } else if (c === '>' && depth > 0) {
        --depth;
      } else if (depth === 0) {
        out += c;
      }
    }
    if (out === full) return full + at;
    var e = el('span', null, out + at);
    e.title = full + at;
    return e;
  }
  function stackText(st) { return st.slice(0, 8).map(frameText).join('\n') + (st.length > 8 ? '\n… ' + (st.length - 8) + ' more' : ''); }
  function sites(title, list, total) {
    tbBox.appendChild(el('h3', null, title));
    if (!list || !list.length) { tbBox.appendChild(el('p', 'hint', 'none')); return; }
    tbBox.appendChild(table([['bytes'], ['count'], ['library', 'l'], ['category', 'l'], ['site', 'l'],
      ['stack (innermost first)', 'stack']],
      list.map(function (s) {
        return [bytes(s.bytes), s.count, s.library, s.category || '', siteCell(s), stackText(s.stack)];
      })));
  }
  // Memory by category (docs/categories.md): live bytes by category at each device's peak,
  // and the highest point of each phase found from frames.
  function categories(c) {
    if (!c || !c.at_peak) return;
    c.at_peak.forEach(function (p) {
      var total = 0, names = Object.keys(p.totals);
      names.forEach(function (k) { total += p.totals[k].bytes; });
      tbBox.appendChild(el('h3', null, 'Memory by category at the peak, cuda:' + p.device + ' (' + bytes(total) +
        (c.training_found ? '; ' + c.steps_found + ' training steps found from frames' : '') + ')'));
      var libs = Object.keys(p.libraries || {}).map(function (l) { return l + ' ' + bytes(p.libraries[l]); }).join(', ');
      tbBox.appendChild(table([['category', 'l'], ['bytes'], ['share'], ['allocations'], ['libraries', 'l']],
        names.filter(function (k) { return p.totals[k].count; }).map(function (k) {
          var b = p.totals[k].bytes;
          return [k, bytes(b), total ? (100 * b / total).toFixed(1) + '%' : '-', p.totals[k].count,
            k === 'library' ? libs : ''];
        })));
    });
    var best = {};
    (c.phases_found || []).forEach(function (f) { if (!best[f.phase] || f.peak_bytes > best[f.phase].peak_bytes) best[f.phase] = f; });
    var kinds = Object.keys(best);
    if (!kinds.length) return;
    tbBox.appendChild(el('h3', null, 'Highest point of each phase found from frames, by category'));
    tbBox.appendChild(table([['phase', 'l'], ['step'], ['live bytes'], ['by category', 'l']], kinds.map(function (k) {
      var f = best[k], by = Object.keys(f.peak_by_category).map(function (n) { return n + ' ' + bytes(f.peak_by_category[n]); });
      return [k, f.step, bytes(f.peak_bytes), by.join(', ')];
    })));
  }
  // Several processes: one row per process and GPU first, and the spread across them.
  var RK = D.summary.ranks;
  if (RK && RK.rows.length) {
    var who = function (r) { return r.rank !== null ? 'rank ' + r.rank : 'pid ' + r.pid; };
    tbBox.appendChild(el('h3', null, 'Processes (times since the earliest start)'));
    tbBox.appendChild(table([['rank'], ['host', 'l'], ['device'], ['pid'], ['peak requested'], ['peak reserved'],
      ['peak at'], ['leaked']], RK.rows.map(function (r) {
      return [r.rank === null ? '-' : r.rank, r.host, r.device === null ? '-' : r.device, r.pid, bytes(r.peak_requested),
        bytes(r.peak_reserved), r.peak_requested > 0 ? seconds(r.peak_ns / 1e9) : '-', bytes(r.leaked_bytes)];
    })));
    ['peak_requested', 'peak_reserved'].forEach(function (k) {
      var sp = RK.spread[k];
      tbBox.appendChild(el('div', null, k.replace('_', ' ') + ': max ' + bytes(sp.max) + ' at ' + who(RK.rows[sp.max_row]) +
        ', min ' + bytes(sp.min) + ' at ' + who(RK.rows[sp.min_row]) + ', max/min ' +
        (sp.max_over_min === null ? 'unknown' : sp.max_over_min.toFixed(2))));
    });
  }
  var docs = D.summary.processes || [D.summary];
  docs.forEach(function (doc) {
    var t = doc.trace;
    tbBox.appendChild(el('h3', null, (t.rank !== undefined ? 'rank ' + t.rank + ', ' : '') + 'pid ' + t.pid +
      (D.summary.ranks ? ' on ' + t.host : '') + ': ' + (t.command || []).join(' ')));
    var METRICS = [['requested_bytes', 'Requested memory', bytes], ['allocated_bytes', 'Allocated memory', bytes],
      ['active_bytes', 'Active memory', bytes], ['reserved_bytes', 'GPU reserved memory', bytes],
      ['inactive_split_bytes', 'Non-releasable memory', bytes], ['allocations', 'Allocations', count],
      ['active_allocs', 'Active allocs', count], ['segments', 'GPU reserved segments', count]];
    (doc.devices || []).forEach(function (d) {
      tbBox.appendChild(el('div', null, 'cuda:' + d.device + ' ' + d.name + ' (' + bytes(d.total_memory) + '), OOMs: ' +
        d.num_ooms + ', cudaMalloc retries: ' + d.num_alloc_retries));
      tbBox.appendChild(table([['Metric', 'l'], ['Cur Usage'], ['Peak Usage'], ['Tot Alloc'], ['Tot Freed']],
        METRICS.map(function (m) {
          var s = d[m[0]];
          return [m[1], m[2](s.current), m[2](s.peak), m[2](s.allocated), m[2](s.freed)];
        })));
    });
    categories(doc.categories);
    sites('Peak consumers (live at each device\'s peak)', doc.peak_consumers);
    sites('Leaks (live at the end): ' + bytes(doc.leaked_bytes) + ' in ' + doc.leaked_count, doc.leaks);
    sites('Most allocations', doc.most_allocations);
    if (doc.ooms && doc.ooms.length) {
      tbBox.appendChild(el('h3', null, 'Out-of-memory events'));
      tbBox.appendChild(table([['device'], ['at'], ['requested'], ['device free'], ['reserved'], ['allocated'], ['cause', 'l'], ['suggestion', 'l']],
        doc.ooms.map(function (o) {
          return [o.device, seconds(o.ts_ns / 1e9), bytes(o.requested), bytes(o.device_free), bytes(o.pool_reserved),
            bytes(o.pool_allocated), o.cause, o.suggestion];
        })));
    }
  });
  var det = el('details');
  det.appendChild(el('summary', null, 'gpuheap summary (text)'));
  det.appendChild(el('pre', 'summary', D.summary_text));
  tbBox.appendChild(det);

  // report.html#selftest: drives the page as a user would (a click on a flame frame, a search,
  // a zoom and a hover on the timeline) and writes the outcome to body[data-selftest], for the
  // headless-browser test, which cannot click.
  function selftest() {
    var why = [];
    flames.forEach(function (fl, k) {
      var r = fl.rects().filter(function (r) { return r[3] !== 0 && r[2] > 2; })[0];
      if (!r) return;
      var b = fl.canvas.getBoundingClientRect();
      var click = function (x, y) {
        fl.canvas.dispatchEvent(new MouseEvent('click', { clientX: b.left + x, clientY: b.top + y, bubbles: true }));
      };
      click(r[0] + 1, r[1] + 2);
      if (fl.root() !== r[3]) why.push('flame ' + k + ': click did not zoom');
      click(1, 2);  // the zoomed frame is the top row now: a click there zooms out
      if (fl.root() === r[3]) why.push('flame ' + k + ': click on the zoomed frame did not zoom out');
      fl.input.value = fl.name[r[3]];
      fl.input.dispatchEvent(new Event('input'));
      if (fl.found.textContent.indexOf('matched') !== 0) why.push('flame ' + k + ': search found nothing');
      fl.input.value = '';
      fl.input.dispatchEvent(new Event('input'));
      // The category filter: one category of several shows less than all, and "all" all again.
      if (fl.select && fl.select.options.length > 2) {
        var whole = fl.total();
        fl.select.value = fl.select.options[1].value;
        fl.select.dispatchEvent(new Event('change'));
        if (!(fl.total() > 0 && fl.total() < whole)) why.push('flame ' + k + ': the category filter did not apply');
        fl.select.value = '';
        fl.select.dispatchEvent(new Event('change'));
        if (fl.total() !== whole) why.push('flame ' + k + ': "all categories" did not restore the graph');
      }
    });
    var asked = charts.map(function (u) {
      var t = u.data[0];
      if (t.length < 4) return null;
      var lo = t[Math.floor(t.length / 4)], hi = t[Math.floor(t.length / 2)];
      u.setScale('x', { min: lo, max: hi });
      return [lo, t[t.length - 1] - t[0]];
    });
    setTimeout(function () {  // uPlot commits scale changes asynchronously
      charts.forEach(function (u, k) {
        if (!asked[k]) return;
        var lo = asked[k][0], full = asked[k][1], span = u.scales.x.max - u.scales.x.min;
        // uPlot may round the range a little: zoomed means about the asked span.
        if (!(span < 0.6 * full && Math.abs(u.scales.x.min - lo) < 0.1 * full))
          why.push('chart ' + k + ': zoom did not apply (' + u.scales.x.min + '..' + u.scales.x.max + ')');
        u.setCursor({ left: u.bbox.width / devicePixelRatio / 2, top: 10 });
        if (u.cursor.idx === null || u.cursor.idx === undefined) why.push('chart ' + k + ': hover found no point');
      });
      document.body.setAttribute('data-selftest', why.length ? 'fail: ' + why.join('; ') : 'ok');
    }, 50);
  }

  built = true;
  finish();
})();
