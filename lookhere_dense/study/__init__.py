"""The extrapolation study: position encodings x seeds x test ladders, trained and
evaluated with the real mmengine Runner, merged across seeds and written as reports."""
