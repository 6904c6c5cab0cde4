// The documentation site opened from its files (file://): browsers refuse to start a Web
// Worker from a file:// URL, and the theme's search runs in one, so search found nothing.
// Here, and only here, a stand-in for Worker runs the worker's script in a hidden iframe of
// this page's origin, and passes messages both ways as a worker would. mkdocs.yml lists it
// among the theme's polyfills: the offline plugin would otherwise add one from a CDN, which
// a site read from files on a cluster's login node cannot reach. Served over HTTP (mkdocs
// serve), the browser's own Worker is used.
"use strict";
(() => {
  if (location.protocol !== "file:") return;

  class FileWorker extends EventTarget {
    constructor(url) {
      super();
      this.frame = document.createElement("iframe");
      this.frame.hidden = true;
      document.body.appendChild(this.frame);
      const scope = this.frame.contentWindow;
      // The worker's script answers with postMessage(data): to this object's listeners,
      // asynchronously, as a worker's answer arrives.
      scope.postMessage = (data) =>
        setTimeout(() => this.dispatchEvent(new MessageEvent("message", { data })));
      this.started = new Promise((resolve, reject) => {
        const script = scope.document.createElement("script");
        script.src = new URL(url, location.href).href;
        script.onload = resolve;
        script.onerror = () => reject(new Error(`cannot load ${script.src}`));
        scope.document.head.appendChild(script);
      });
    }

    postMessage(data) {
      this.started.then(() =>
        this.frame.contentWindow.dispatchEvent(new MessageEvent("message", { data })));
    }

    terminate() {
      this.frame.remove();
    }
  }

  window.Worker = FileWorker;
})();
