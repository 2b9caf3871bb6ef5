// Loaded between the vendored require.js and embed-amd.js (see nb_ipywidgets_js in _config.yml).
// embed-amd.js defines the AMD modules @jupyter-widgets/base, controls and html-manager, and each
// finds its fonts and other assets next to its module URL. By default RequireJS puts those URLs
// under the page's own folder (notebooks/@jupyter-widgets/...), where nothing is served; map the
// modules to the folder that holds embed-amd.js and its assets: _static/widgets/.
(function () {
  var here = document.currentScript.src;
  var widgets = here.slice(0, here.lastIndexOf("/") + 1) + "widgets";
  require.config({
    paths: {
      "@jupyter-widgets/base": widgets + "/base",
      "@jupyter-widgets/controls": widgets + "/controls",
      "@jupyter-widgets/html-manager": widgets + "/html-manager",
      "@jupyter-widgets/html-manager/dist": widgets
    }
  });
})();

// The widgets typeset their labels with the MathJax 2 API, MathJax.Hub.Queue(["Typeset", Hub, el]).
// Sphinx loads MathJax 3 on pages with math, which has no Hub, so on a page with both math and
// widgets every label raised "Cannot read properties of undefined (reading 'Queue')". Give
// MathJax 3 that one call. MathJax's script is deferred, so it has run by DOMContentLoaded; the
// widgets render later, on the window's load event.
document.addEventListener("DOMContentLoaded", function () {
  var mathjax = window.MathJax;
  if (!mathjax || mathjax.Hub || !mathjax.startup || !mathjax.startup.promise) {
    return;
  }
  mathjax.Hub = {
    Queue: function (job) {
      var element = job && job[2];
      if (!element) {
        return;
      }
      mathjax.startup.promise
        .then(function () { return mathjax.typesetPromise([element]); })
        .catch(function (error) { console.warn("MathJax could not typeset a widget label:", error); });
    }
  };
});
