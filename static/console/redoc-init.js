// The API docs page: Redoc reads the schema URL from the container (no inline script, which the
// Content-Security-Policy refuses).
(function () {
  "use strict";
  var container = document.getElementById("redoc-container");
  Redoc.init(container.getAttribute("data-spec-url"), {}, container);
})();
