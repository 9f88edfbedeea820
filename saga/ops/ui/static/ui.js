// Draws each <pre class="mermaid"> diagram once the page has loaded. Mermaid reads the
// diagram's text (the server escaped it into the page) and sanitises every label it draws.
mermaid.initialize({ startOnLoad: true, securityLevel: "strict", theme: "default" });
