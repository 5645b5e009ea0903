"""The output policy, one section a module: :mod:`.output` (the policy, :class:`OutputPolicy`),
:mod:`.text` (URL and text rules), :mod:`.sanitizers` (HTML, SVG and Markdown), :mod:`.vega`
(Vega and Vega-Lite specs) and :mod:`.widgets` (the widget comms' state)."""
