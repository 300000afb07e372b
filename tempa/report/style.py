"""The report's inline CSS and script (a Python module, not data files: the page must be
one file, and a module always ships with the package)."""

CSS = """
:root { --fg:#1d2330; --muted:#5d6778; --bg:#ffffff; --panel:#f5f7fa; --line:#dde2ea;
        --good:#1a7f37; --goodbg:#e9f7ee; --warn:#9a6700; --warnbg:#fff6dd;
        --bad:#b42318; --badbg:#fdecea; --eager:#d9822b; --compiled:#2f6fde; }
* { box-sizing: border-box; }
body { font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--fg);
       background: var(--bg); margin: 0; }
header { background: #16213a; color: #fff; padding: 18px 32px; }
header h1 { margin: 0 0 4px; font-size: 22px; font-weight: 600; }
header .sub { color: #b9c3d6; font-size: 13px; }
nav { position: sticky; top: 0; background: #fff; border-bottom: 1px solid var(--line);
      padding: 8px 32px; font-size: 13px; z-index: 1; }
nav a { margin-right: 16px; color: var(--compiled); text-decoration: none; }
nav a .count { color: var(--muted); }
main { padding: 8px 32px 48px; max-width: 1180px; }
section { margin-top: 26px; }
h2 { font-size: 18px; border-bottom: 1px solid var(--line); padding-bottom: 4px; }
h3 { font-size: 15px; margin: 18px 0 6px; }
.verdict { border-radius: 8px; padding: 12px 16px; margin: 10px 0; border-left: 6px solid; }
.verdict.good { background: var(--goodbg); border-color: var(--good); }
.verdict.warn { background: var(--warnbg); border-color: var(--warn); }
.verdict.bad { background: var(--badbg); border-color: var(--bad); }
.verdict .mode { font-weight: 600; margin-right: 8px; }
.verdict ul { margin: 6px 0 0; padding-left: 20px; color: var(--muted); font-size: 13px; }
table { border-collapse: collapse; font-size: 14px; margin: 8px 0; }
th, td { border-bottom: 1px solid var(--line); padding: 5px 12px; text-align: right; }
td { white-space: nowrap; }
.kv td, td.failed { white-space: normal; }
th:first-child, td:first-child { text-align: left; }
th { background: var(--panel); font-weight: 600; }
td.failed { color: var(--bad); font-weight: 600; }
.kv td { text-align: left; }
.muted { color: var(--muted); font-size: 13px; }
pre { background: var(--panel); border: 1px solid var(--line); border-radius: 6px;
      padding: 10px 12px; overflow-x: auto; font: 12.5px/1.45 ui-monospace, "SFMono-Regular",
      Menlo, Consolas, monospace; margin: 6px 0; }
pre.src .hit { background: #ffe8a3; display: block; }
details { margin: 6px 0; }
summary { cursor: pointer; font-weight: 500; }
.tag { display: inline-block; border-radius: 10px; padding: 0 8px; font-size: 12px;
       background: var(--panel); border: 1px solid var(--line); margin-left: 6px; }
.tag.bad { background: var(--badbg); border-color: #f3b4ad; color: var(--bad); }
.tag.good { background: var(--goodbg); border-color: #a5d8b5; color: var(--good); }
.card { border: 1px solid var(--line); border-radius: 8px; padding: 10px 14px; margin: 10px 0; }
.chart { max-width: 100%; height: auto; display: block; margin: 8px 0 16px; }
.chart .grid { stroke: #e8ebf0; } .chart .axis { stroke: #8a93a3; }
.chart .tick { font-size: 11px; fill: #5d6778; } .chart .alabel { font-size: 12px; fill: #3b4352; }
.chart .ctitle { font-size: 14px; font-weight: 600; fill: #1d2330; }
.chart .legend { font-size: 12px; fill: #1d2330; }
.chart .marker { stroke: var(--good); stroke-dasharray: 3 3; stroke-width: 1.5; }
.chart .mlabel { font-size: 12px; fill: var(--good); font-weight: 600; }
.chart .dot { fill: var(--good); }
.empty { color: var(--muted); font-style: italic; }
button.toggle { font-size: 12px; margin-left: 8px; }
"""

# The only script: section counts in the navigation, and "expand all" for the code blocks.
# It also marks the body as rendered, which the browser test checks.
JS = """
(function () {
  document.querySelectorAll('nav a[href^="#"]').forEach(function (a) {
    var s = document.querySelector(a.getAttribute('href'));
    var n = s ? s.querySelectorAll('[data-item]').length : 0;
    if (n) { var c = document.createElement('span'); c.className = 'count';
             c.textContent = ' (' + n + ')'; a.appendChild(c); }
  });
  document.querySelectorAll('button.toggle').forEach(function (b) {
    b.addEventListener('click', function () {
      var box = b.closest('section'), open = b.dataset.open !== '1';
      box.querySelectorAll('details').forEach(function (d) { d.open = open; });
      b.dataset.open = open ? '1' : '0';
      b.textContent = open ? 'collapse all' : 'expand all';
    });
  });
  document.body.setAttribute('data-rendered', '1');
})();
"""
