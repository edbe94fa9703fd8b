"""Dictionary v1 of :mod:`cosigner.db.compressed` (zstd raw-content dictionary).

NEVER EDIT: every row compressed with it needs exactly these bytes to be read back
(tests/db/test_compressed.py pins their SHA-256). A better dictionary is a new module
``zdict_v2`` with its own format byte. The samples are one allow decision of the bench
call (bench/lua/decide.lua): its stored policy input, its response, and its two events
(``decision.made``, ``permit.minted``) in their canonical form.
"""

SAMPLES = (
    (
        '{"tenant":"bench","principal":{"id":"customer-42","type":"customer"},"initiator":{"i'
        'd":"agent-support","type":"agent"},"caller":{"subject":"bench-runtime","roles":["run'
        'time"]},"tool":{"name":"issue_refund","side_effect":"financial"},"args":{"order_id":'
        '"ord_8472","amount_minor":5000,"currency":"USD","reason_code":"duplicate_charge"},"c'
        'ontext":{},"run":{"id":"run-seed16109x1796101959-0","step":1}}'
    ),
    (
        '{"decision_id":"01a23004-efcf-7694-807a-b2d4c931f2a2","request_id":"req-seed16109x17'
        '96101959-0","effect":"allow","reasons":[{"code":"within_auto_limit","message":"refun'
        'd within the automatic limit"}],"policy":{"id":"refunds","version":"1.0.0","revision'
        '":"sha256:ffb8318fccd8fc469da3b3b0d8ccbb609f55b181488ea53a71c8f6f9e16180e1"},"args_h'
        'ash":"sha256:85f00eeed9a176bd9416940ddd133862a9b5e0f213a61116f9bee6d5369b3370","perm'
        'it":{"token":"eyJhbGciOiJFZDI1NTE5Iiwia2lkIjoiclN3OWQyQ3BEOXgxdTdTdGpBcUtJa3J2MG5RN3'
        'gtcC05WTFuT0c3cnpHTSIsInR5cCI6ImNvc2lnbmVyLXBlcm1pdCtqd3QifQ.eyJpc3MiOiJjb3NpZ25lciI'
        'sImF1ZCI6ImNvc2lnbmVyLWV4ZWN1dG9yIiwianRpIjoiMDFhMjMwMDRlZmNmNzY5NDgwN2FiMmQ1N2I2OGF'
        'kZDkiLCJpYXQiOjE3OTYxMDE5NTksIm5iZiI6MTc5NjEwMTk1OSwiZXhwIjoxNzk2MTg4MzU5LCJ0ZW5hbnQ'
        'iOiJiZW5jaCIsInJ1biI6InJ1bi1zZWVkMTYxMDl4MTc5NjEwMTk1OS0wIiwiZGVjaXNpb25faWQiOiIwMWE'
        'yMzAwNC1lZmNmLTc2OTQtODA3YS1iMmQ0YzkzMWYyYTIiLCJ0b29sIjoiaXNzdWVfcmVmdW5kIiwiYXJnc19'
        'oYXNoIjoic2hhMjU2Ojg1ZjAwZWVlZDlhMTc2YmQ5NDE2OTQwZGRkMTMzODYyYTliNWUwZjIxM2E2MTExNmY'
        '5YmVlNmQ1MzY5YjMzNzAiLCJwb2xpY3kiOnsiaWQiOiJyZWZ1bmRzIiwidmVyc2lvbiI6IjEuMC4wIiwicmV'
        '2aXNpb24iOiJzaGEyNTY6ZmZiODMxOGZjY2Q4ZmM0NjlkYTNiM2IwZDhjY2JiNjA5ZjU1YjE4MTQ4OGVhNTN'
        'hNzFjOGY2ZjllMTYxODBlMSJ9LCJhcHByb3ZlcnMiOltdfQ.TE_ayf0NUSMLs5eK_J8tHKlrZ4lfVINJI_HF'
        'kymrw3yri19QLyraxcANs10SWupgO8Vtx0Fp62qibJF2m1C2Aw","jti":"01a23004efcf7694807ab2d57'
        'b68add9","expires_at":"2026-12-02T05:12:39Z"},"approval":null}'
    ),
    (
        '{"actor":{"kind":"key","principal_id":"00000000-0000-7000-8000-000000000000","subjec'
        't":"bench-runtime"},"args_hash":"sha256:85f00eeed9a176bd9416940ddd133862a9b5e0f213a6'
        '1116f9bee6d5369b3370","effect":"allow","payload":{"args":{"amount_minor":5000,"curre'
        'ncy":"USD","order_id":"ord_8472","reason_code":"duplicate_charge"},"caller_roles":["'
        'runtime"],"context":{},"eval_us":25,"initiator":{"id":"agent-support","type":"agent"'
        '},"principal":{"id":"customer-42","type":"customer"},"reasons":[{"code":"within_auto'
        '_limit","message":"refund within the automatic limit"}],"request_id":"req-seed16109x'
        '1796101959-0","run":{"id":"run-seed16109x1796101959-0","step":1},"tool":{"name":"iss'
        'ue_refund","side_effect":"financial"}},"policy":{"id":"refunds","revision":"sha256:f'
        'fb8318fccd8fc469da3b3b0d8ccbb609f55b181488ea53a71c8f6f9e16180e1","version":"1.0.0"},'
        '"prev_hash":"sha256:0000000000000000000000000000000000000000000000000000000000000000'
        '","schema_version":1,"seq":1,"subject":{"decision_id":"01a23004-efcf-7694-807a-b2d4c'
        '931f2a2","run_id":"run-seed16109x1796101959-0"},"tenant":"bench","time":"2026-12-01T'
        '05:12:39.631359Z","tool":"issue_refund","type":"decision.made"}'
    ),
    (
        '{"actor":{"kind":"key","principal_id":"00000000-0000-7000-8000-000000000000","subjec'
        't":"bench-runtime"},"args_hash":"sha256:85f00eeed9a176bd9416940ddd133862a9b5e0f213a6'
        '1116f9bee6d5369b3370","effect":null,"payload":{"approvers":[],"exp":1796188359,"kid"'
        ':"rSw9d2CpD9x1u7StjAqKIkrv0nQ7x-p-9Y1nOG7rzGM"},"policy":{"id":"refunds","revision":'
        '"sha256:ffb8318fccd8fc469da3b3b0d8ccbb609f55b181488ea53a71c8f6f9e16180e1","version":'
        '"1.0.0"},"prev_hash":"sha256:fcc73aa82f40372691dd4773e2ccc170547b91e2896695dcbe97ede'
        'd8438cb06","schema_version":1,"seq":2,"subject":{"decision_id":"01a23004-efcf-7694-8'
        '07a-b2d4c931f2a2","permit_jti":"01a23004efcf7694807ab2d57b68add9","run_id":"run-seed'
        '16109x1796101959-0"},"tenant":"bench","time":"2026-12-01T05:12:39.631359Z","tool":"i'
        'ssue_refund","type":"permit.minted"}'
    ),
)

DICTIONARY = "\n".join(SAMPLES).encode()
