-- The floor: GET / on bench/floor_app.py (a constant). No request() callback, so wrk
-- sends one pre-built request, its cheapest path.
dofile(os.getenv("BENCH_LUA_DIR") .. "/report.lua")
wrk.method = "GET"
wrk.path = "/"
bench_check_hook('"ok":(%a+)')
