--
-- PostgreSQL database dump
--

\restrict sis1DXLHX02DYj9u3BWOXRwa2LCffYVdioCLx7oOwLc5eZ2YCdKQJ292decsLVY

-- Dumped from database version 15.20 (Debian 15.20-0+deb12u1)
-- Dumped by pg_dump version 15.20 (Debian 15.20-0+deb12u1)

SET statement_timeout = 0;
SET lock_timeout = 0;
SET idle_in_transaction_session_timeout = 0;
SET client_encoding = 'UTF8';
SET standard_conforming_strings = on;
SELECT pg_catalog.set_config('search_path', '', false);
SET check_function_bodies = false;
SET xmloption = content;
SET client_min_messages = warning;
SET row_security = off;

SET default_tablespace = '';

SET default_table_access_method = heap;

--
-- Name: alembic_version; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.alembic_version (
    version_num character varying(32) NOT NULL
);


--
-- Name: api_keys; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.api_keys (
    id character varying(32) NOT NULL,
    principal_id character varying(36) NOT NULL,
    secret_hash character varying(64) NOT NULL,
    created_at timestamp with time zone NOT NULL,
    revoked_at timestamp with time zone
);


--
-- Name: approvals; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.approvals (
    id character varying(36) NOT NULL,
    tenant character varying(128) NOT NULL,
    kind character varying(16) NOT NULL,
    decision_id character varying(36) NOT NULL,
    run_id character varying(256) NOT NULL,
    tool character varying(256) NOT NULL,
    args_hash character varying(71) NOT NULL,
    args text NOT NULL,
    mask json NOT NULL,
    requirement json NOT NULL,
    status character varying(16) NOT NULL,
    initiator json NOT NULL,
    principal json NOT NULL,
    opened_by json NOT NULL,
    reasons json NOT NULL,
    policy json,
    reason text,
    created_at timestamp with time zone NOT NULL,
    expires_at timestamp with time zone NOT NULL,
    decided_at timestamp with time zone,
    permit_jti character varying(64),
    permit json
);


--
-- Name: audit_checkpoints; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.audit_checkpoints (
    tenant character varying(128) NOT NULL,
    seq bigint NOT NULL,
    hash character varying(71) NOT NULL,
    "time" timestamp with time zone NOT NULL,
    kid character varying(64) NOT NULL,
    token text NOT NULL
);


--
-- Name: audit_events; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.audit_events (
    id bigint NOT NULL,
    tenant character varying(128) NOT NULL,
    seq bigint NOT NULL,
    type character varying(64) NOT NULL,
    "time" timestamp with time zone NOT NULL,
    decision_id character varying(36),
    approval_id character varying(36),
    permit_jti character varying(64),
    run_id character varying(256),
    tool character varying(256),
    effect character varying(32),
    principal character varying(256),
    policy_id character varying(128),
    policy_version character varying(64),
    body text NOT NULL,
    hash character varying(71) NOT NULL
);


--
-- Name: audit_events_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.audit_events_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: audit_events_id_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.audit_events_id_seq OWNED BY public.audit_events.id;


--
-- Name: audit_heads; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.audit_heads (
    tenant character varying(128) NOT NULL,
    seq bigint NOT NULL,
    hash character varying(71) NOT NULL
);


--
-- Name: call_inputs; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.call_inputs (
    decision_id character varying(36) NOT NULL,
    tenant character varying(128) NOT NULL,
    input json NOT NULL,
    mask json NOT NULL
);


--
-- Name: decision_outcomes; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.decision_outcomes (
    decision_id character varying(36) NOT NULL,
    tenant character varying(128) NOT NULL,
    run_id character varying(256) NOT NULL,
    outcome character varying(16) NOT NULL,
    side_effect character varying(16) NOT NULL,
    cost_minor bigint,
    reported_by character varying(256) NOT NULL,
    reported_at timestamp with time zone NOT NULL
);


--
-- Name: decisions; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.decisions (
    id character varying(36) NOT NULL,
    tenant character varying(128) NOT NULL,
    request_id character varying(256) NOT NULL,
    request_hash character varying(71) NOT NULL,
    run_id character varying(256) NOT NULL,
    tool character varying(256) NOT NULL,
    args_hash character varying(71) NOT NULL,
    effect character varying(32) NOT NULL,
    caller character varying(256) NOT NULL,
    policy_id character varying(128),
    policy_version character varying(64),
    policy_revision character varying(71),
    response json NOT NULL,
    created_at timestamp with time zone NOT NULL
);


--
-- Name: permits; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.permits (
    jti character varying(64) NOT NULL,
    tenant character varying(128) NOT NULL,
    decision_id character varying(36) NOT NULL,
    approval_id character varying(36),
    run_id character varying(256) NOT NULL,
    tool character varying(256) NOT NULL,
    args_hash character varying(71) NOT NULL,
    status character varying(16) NOT NULL,
    issued_at timestamp with time zone NOT NULL,
    expires_at timestamp with time zone NOT NULL,
    redeemed_at timestamp with time zone,
    revoked_at timestamp with time zone
);


--
-- Name: principals; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.principals (
    id character varying(36) NOT NULL,
    tenant character varying(128) NOT NULL,
    subject character varying(256) NOT NULL,
    kind character varying(16) NOT NULL,
    roles json NOT NULL,
    password_hash text,
    disabled boolean NOT NULL,
    created_at timestamp with time zone NOT NULL
);


--
-- Name: reviews; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.reviews (
    id character varying(36) NOT NULL,
    approval_id character varying(36) NOT NULL,
    tenant character varying(128) NOT NULL,
    run_id character varying(256) NOT NULL,
    subject character varying(256) NOT NULL,
    principal_id character varying(36) NOT NULL,
    roles json NOT NULL,
    role character varying(64),
    decision character varying(16) NOT NULL,
    comment text NOT NULL,
    created_at timestamp with time zone NOT NULL
);


--
-- Name: runs; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.runs (
    tenant character varying(128) NOT NULL,
    run_id character varying(256) NOT NULL,
    contract json NOT NULL,
    contract_hash character varying(71) NOT NULL,
    deadline timestamp with time zone,
    tool_calls integer NOT NULL,
    cost_minor bigint NOT NULL,
    tool_counts json NOT NULL,
    created_by character varying(256) NOT NULL,
    created_at timestamp with time zone NOT NULL,
    updated_at timestamp with time zone NOT NULL
);


--
-- Name: signin_failures; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.signin_failures (
    key character varying(512) NOT NULL,
    failures integer NOT NULL,
    window_start timestamp with time zone NOT NULL,
    locked_until timestamp with time zone
);


--
-- Name: web_sessions; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.web_sessions (
    id_hash character varying(64) NOT NULL,
    principal_id character varying(36) NOT NULL,
    tenant character varying(128) NOT NULL,
    created_at timestamp with time zone NOT NULL,
    last_seen_at timestamp with time zone NOT NULL
);


--
-- Name: webhook_attempts; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.webhook_attempts (
    id bigint NOT NULL,
    delivery_id character varying(36) NOT NULL,
    attempt integer NOT NULL,
    at timestamp with time zone NOT NULL,
    status_code integer,
    error character varying(500),
    duration_ms integer NOT NULL
);


--
-- Name: webhook_attempts_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.webhook_attempts_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: webhook_attempts_id_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.webhook_attempts_id_seq OWNED BY public.webhook_attempts.id;


--
-- Name: webhook_deliveries; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.webhook_deliveries (
    id character varying(36) NOT NULL,
    tenant character varying(128) NOT NULL,
    event_type character varying(64) NOT NULL,
    url text NOT NULL,
    body text NOT NULL,
    status character varying(16) NOT NULL,
    attempts integer NOT NULL,
    next_attempt_at timestamp with time zone NOT NULL,
    claimed_until timestamp with time zone,
    created_at timestamp with time zone NOT NULL,
    delivered_at timestamp with time zone
);


--
-- Name: audit_events id; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.audit_events ALTER COLUMN id SET DEFAULT nextval('public.audit_events_id_seq'::regclass);


--
-- Name: webhook_attempts id; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.webhook_attempts ALTER COLUMN id SET DEFAULT nextval('public.webhook_attempts_id_seq'::regclass);


--
-- Data for Name: alembic_version; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.alembic_version VALUES ('0005_runs');
INSERT INTO public.alembic_version VALUES ('0004_web');
INSERT INTO public.alembic_version VALUES ('0003_audit');
INSERT INTO public.alembic_version VALUES ('0002_approvals');


--
-- Data for Name: api_keys; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.api_keys VALUES ('751ec9a387fd0e6c', '745ba324-84d7-4798-a531-a730a243d7e7', '641cae3d5c5687d5561d8076024cb33c01330b28fd375d44e04f43c3069777c5', '2026-12-01 02:07:42.361512+00', NULL);
INSERT INTO public.api_keys VALUES ('18aa88c01d40834b', 'd3aa981e-180c-45da-84fa-ef8b8702c043', 'c06386bede70b23802c1e3402ba56f1386445593ee6199872f4fd4edb6386ef5', '2026-12-01 02:07:43.527455+00', NULL);
INSERT INTO public.api_keys VALUES ('1153fbee5e425844', 'af2ab2fe-7102-44ee-8bac-7eee196ff7ef', '042d4b691581c9ddfa7eb311fdc975fc6a36aa5d5ac4e5e13ab0595839aa8b7b', '2026-12-01 02:07:44.850773+00', NULL);


--
-- Data for Name: approvals; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.approvals VALUES ('134ad6af-8ef2-4eeb-8226-b92253d4896a', 'legacy', 'policy', '566a9650-56c3-4471-bae8-c96b456a5cb9', 'run-legacy', 'issue_refund', 'sha256:0a66ad5a8d1e1028f0f3df7744f56a8e7c1702c50cefc22cc8dd8685081a36c9', '{"amount_minor":150000,"currency":"USD","order_id":"ord_150000","reason_code":"duplicate_charge"}', '[]', '{"require":[{"role":"finance","count":1}],"timeout_ms":1800000,"distinct_from":"initiator_and_previous"}', 'approved', '{"id":"support-agent","type":"agent"}', '{"id":"customer-42","type":"customer"}', '{"subject":"legacy-runtime","principal_id":"745ba324-84d7-4798-a531-a730a243d7e7","kind":"key"}', '[{"code":"over_auto_limit","message":"refunds above 100000 need finance approval"}]', '{"id":"refunds","version":"1.0.0-upgrade-fixture","revision":"sha256:553efea08b58f2e43e18f5c0baa5b466a7c48b47beba039bc2e7a8721d6f911c"}', NULL, '2026-12-01 02:07:50.19749+00', '2026-12-01 02:37:50.19749+00', '2026-12-01 02:07:50.244474+00', 'f4868f3a565643e8a2e31410d76391d7', '{"token":"eyJhbGciOiJFZDI1NTE5Iiwia2lkIjoiYXdPOG1sRDhPMDljSEtNamtjNXFMSEFHMHVRMm1GVVdocUVpYWhNZGFvUSIsInR5cCI6ImNvc2lnbmVyLXBlcm1pdCtqd3QifQ.eyJpc3MiOiJjb3NpZ25lciIsImF1ZCI6ImNvc2lnbmVyLWV4ZWN1dG9yIiwianRpIjoiZjQ4NjhmM2E1NjU2NDNlOGEyZTMxNDEwZDc2MzkxZDciLCJpYXQiOjE3OTYwOTA4NzAsIm5iZiI6MTc5NjA5MDg3MCwiZXhwIjoxNzk2MDkyNjY5LCJ0ZW5hbnQiOiJsZWdhY3kiLCJydW4iOiJydW4tbGVnYWN5IiwiZGVjaXNpb25faWQiOiI1NjZhOTY1MC01NmMzLTQ0NzEtYmFlOC1jOTZiNDU2YTVjYjkiLCJhcHByb3ZhbF9pZCI6IjEzNGFkNmFmLThlZjItNGVlYi04MjI2LWI5MjI1M2Q0ODk2YSIsInRvb2wiOiJpc3N1ZV9yZWZ1bmQiLCJhcmdzX2hhc2giOiJzaGEyNTY6MGE2NmFkNWE4ZDFlMTAyOGYwZjNkZjc3NDRmNTZhOGU3YzE3MDJjNTBjZWZjMjJjYzhkZDg2ODUwODFhMzZjOSIsInBvbGljeSI6eyJpZCI6InJlZnVuZHMiLCJ2ZXJzaW9uIjoiMS4wLjAtdXBncmFkZS1maXh0dXJlIiwicmV2aXNpb24iOiJzaGEyNTY6NTUzZWZlYTA4YjU4ZjJlNDNlMThmNWMwYmFhNWI0NjZhN2M0OGI0N2JlYmEwMzliYzJlN2E4NzIxZDZmOTExYyJ9LCJhcHByb3ZlcnMiOlt7ImlkIjoibGVnYWN5LWZpbmFuY2UiLCJyb2xlIjoiZmluYW5jZSIsImF0IjoxNzk2MDkwODcwfV19.zBkyReDyh7NQhMLU5qkF5NR_mtUdMFeR9DGY-r_oj7vAj0o67EEXker_Ut-DDKBZiYvT_3fww1WAZsFkra9EAg","jti":"f4868f3a565643e8a2e31410d76391d7","expires_at":"2026-12-01T02:37:49Z"}');


--
-- Data for Name: audit_checkpoints; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.audit_checkpoints VALUES ('legacy', 14, 'sha256:c03225421a8c160aeed80fcffb53a45d235d129956bea2b73a46d45c3b7a6522', '2026-12-01 02:07:51.629117+00', 'awO8mlD8O09cHKMjkc5qLHAG0uQ2mFUWhqEiahMdaoQ', 'eyJhbGciOiJFZDI1NTE5Iiwia2lkIjoiYXdPOG1sRDhPMDljSEtNamtjNXFMSEFHMHVRMm1GVVdocUVpYWhNZGFvUSIsInR5cCI6ImNvc2lnbmVyLWNoZWNrcG9pbnQrand0In0.eyJ0ZW5hbnQiOiJsZWdhY3kiLCJzZXEiOjE0LCJoYXNoIjoic2hhMjU2OmMwMzIyNTQyMWE4YzE2MGFlZWQ4MGZjZmZiNTNhNDVkMjM1ZDEyOTk1NmJlYTJiNzNhNDZkNDVjM2I3YTY1MjIiLCJ0aW1lIjoiMjAyNi0xMi0wMVQwMjowNzo1MS42MjkxMTdaIn0.gdIDaW0Qjei2pRCAfxOZneI7qduELNgPv_V0v5iCISJzHNRs6icxhRThp9jeGltY7U8tA85_gl7zbtRpbzK2AA');


--
-- Data for Name: audit_events; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.audit_events VALUES (1, 'legacy', 1, 'principal.created', '2026-12-01 02:07:42.361512+00', NULL, NULL, NULL, NULL, NULL, NULL, 'legacy-runtime', NULL, NULL, '{"actor":{"kind":"cli","principal_id":null,"subject":"cli"},"args_hash":null,"effect":null,"payload":{"api_key_id":"751ec9a387fd0e6c","kind":"key","principal_id":"745ba324-84d7-4798-a531-a730a243d7e7","roles":["runtime"],"subject":"legacy-runtime"},"policy":null,"prev_hash":"sha256:0000000000000000000000000000000000000000000000000000000000000000","schema_version":1,"seq":1,"subject":{},"tenant":"legacy","time":"2026-12-01T02:07:42.361512Z","tool":null,"type":"principal.created"}', 'sha256:a6cd3abd9ea362499a62eb72246697a0e5a223a00bc711f8b12ad13322e555c6');
INSERT INTO public.audit_events VALUES (2, 'legacy', 2, 'principal.created', '2026-12-01 02:07:43.527455+00', NULL, NULL, NULL, NULL, NULL, NULL, 'legacy-finance', NULL, NULL, '{"actor":{"kind":"cli","principal_id":null,"subject":"cli"},"args_hash":null,"effect":null,"payload":{"api_key_id":"18aa88c01d40834b","kind":"key","principal_id":"d3aa981e-180c-45da-84fa-ef8b8702c043","roles":["finance"],"subject":"legacy-finance"},"policy":null,"prev_hash":"sha256:a6cd3abd9ea362499a62eb72246697a0e5a223a00bc711f8b12ad13322e555c6","schema_version":1,"seq":2,"subject":{},"tenant":"legacy","time":"2026-12-01T02:07:43.527455Z","tool":null,"type":"principal.created"}', 'sha256:5e1e4528a2d2b8acef2553cfbf045bf2cd8419e51fb975d100b9059de880e9c8');
INSERT INTO public.audit_events VALUES (3, 'legacy', 3, 'principal.created', '2026-12-01 02:07:44.850773+00', NULL, NULL, NULL, NULL, NULL, NULL, 'legacy-auditor', NULL, NULL, '{"actor":{"kind":"cli","principal_id":null,"subject":"cli"},"args_hash":null,"effect":null,"payload":{"api_key_id":"1153fbee5e425844","kind":"key","principal_id":"af2ab2fe-7102-44ee-8bac-7eee196ff7ef","roles":["auditor"],"subject":"legacy-auditor"},"policy":null,"prev_hash":"sha256:5e1e4528a2d2b8acef2553cfbf045bf2cd8419e51fb975d100b9059de880e9c8","schema_version":1,"seq":3,"subject":{},"tenant":"legacy","time":"2026-12-01T02:07:44.850773Z","tool":null,"type":"principal.created"}', 'sha256:181f45e15c65273d7e6ef7f4a1485894f04478cf126c4a66d9a16da3f17bbe63');
INSERT INTO public.audit_events VALUES (4, '_system', 1, 'key.created', '2026-12-01 02:07:49.741934+00', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, '{"actor":{"kind":"system","principal_id":null,"subject":"system"},"args_hash":null,"effect":null,"payload":{"alg":"Ed25519","created_at":"2026-12-01T02:07:37.889907Z","kid":"awO8mlD8O09cHKMjkc5qLHAG0uQ2mFUWhqEiahMdaoQ","retired_at":null},"policy":null,"prev_hash":"sha256:0000000000000000000000000000000000000000000000000000000000000000","schema_version":1,"seq":1,"subject":{},"tenant":"_system","time":"2026-12-01T02:07:49.741934Z","tool":null,"type":"key.created"}', 'sha256:0a3cee9a36d3f6aa32e69b6d9088256afe69ea878079432562e0540e4cd83383');
INSERT INTO public.audit_events VALUES (5, '_system', 2, 'policy.loaded', '2026-12-01 02:07:49.741934+00', NULL, NULL, NULL, NULL, NULL, NULL, NULL, 'refunds', '1.0.0-upgrade-fixture', '{"actor":{"kind":"system","principal_id":null,"subject":"system"},"args_hash":null,"effect":null,"payload":{"engine":"python","path":"/work/wt-h5/tests/db/data/bundles/refunds","tenants":["*"]},"policy":{"id":"refunds","revision":"sha256:553efea08b58f2e43e18f5c0baa5b466a7c48b47beba039bc2e7a8721d6f911c","version":"1.0.0-upgrade-fixture"},"prev_hash":"sha256:0a3cee9a36d3f6aa32e69b6d9088256afe69ea878079432562e0540e4cd83383","schema_version":1,"seq":2,"subject":{},"tenant":"_system","time":"2026-12-01T02:07:49.741934Z","tool":null,"type":"policy.loaded"}', 'sha256:dc4735896ff6ad1f4534d187d61e110173bf162cc71dca634ed4e0d831eb9c2b');
INSERT INTO public.audit_events VALUES (6, '_system', 3, 'policy.activated', '2026-12-01 02:07:49.741934+00', NULL, NULL, NULL, NULL, NULL, NULL, NULL, 'refunds', '1.0.0-upgrade-fixture', '{"actor":{"kind":"system","principal_id":null,"subject":"system"},"args_hash":null,"effect":null,"payload":{"previous":null},"policy":{"id":"refunds","revision":"sha256:553efea08b58f2e43e18f5c0baa5b466a7c48b47beba039bc2e7a8721d6f911c","version":"1.0.0-upgrade-fixture"},"prev_hash":"sha256:dc4735896ff6ad1f4534d187d61e110173bf162cc71dca634ed4e0d831eb9c2b","schema_version":1,"seq":3,"subject":{},"tenant":"_system","time":"2026-12-01T02:07:49.741934Z","tool":null,"type":"policy.activated"}', 'sha256:94d2e7fde5f9e6fce86ff76fec48eef4abf3578ff1f43deda2fb9f8cf3cca0bc');
INSERT INTO public.audit_events VALUES (7, 'legacy', 4, 'decision.made', '2026-12-01 02:07:50.032317+00', 'c661a86d-2dac-4fe3-8ff4-517f0cfdcefe', NULL, NULL, 'run-legacy', 'issue_refund', 'allow', 'customer-42', 'refunds', '1.0.0-upgrade-fixture', '{"actor":{"kind":"key","principal_id":"745ba324-84d7-4798-a531-a730a243d7e7","subject":"legacy-runtime"},"args_hash":"sha256:434a573d76d7b72dacf5be09730119950b6aaf5e7d9399fce001bc223ec2e61d","effect":"allow","payload":{"args":{"amount_minor":5000,"currency":"USD","order_id":"ord_5000","reason_code":"duplicate_charge"},"context":{},"eval_us":36,"initiator":{"id":"support-agent","type":"agent"},"principal":{"id":"customer-42","type":"customer"},"reasons":[{"code":"within_auto_limit","message":"refund within the automatic limit"}],"request_id":"legacy-allow-kept","run":{"id":"run-legacy","step":1},"tool":{"name":"issue_refund","side_effect":"financial"}},"policy":{"id":"refunds","revision":"sha256:553efea08b58f2e43e18f5c0baa5b466a7c48b47beba039bc2e7a8721d6f911c","version":"1.0.0-upgrade-fixture"},"prev_hash":"sha256:181f45e15c65273d7e6ef7f4a1485894f04478cf126c4a66d9a16da3f17bbe63","schema_version":1,"seq":4,"subject":{"decision_id":"c661a86d-2dac-4fe3-8ff4-517f0cfdcefe","run_id":"run-legacy"},"tenant":"legacy","time":"2026-12-01T02:07:50.032317Z","tool":"issue_refund","type":"decision.made"}', 'sha256:343d22c750e5008591da30e361ea27d3ab1eb44458f16334116cd2e0e926b724');
INSERT INTO public.audit_events VALUES (8, 'legacy', 5, 'permit.minted', '2026-12-01 02:07:50.032317+00', 'c661a86d-2dac-4fe3-8ff4-517f0cfdcefe', NULL, '5763875825a44437b522d25ff17eb6cf', 'run-legacy', 'issue_refund', NULL, NULL, 'refunds', '1.0.0-upgrade-fixture', '{"actor":{"kind":"key","principal_id":"745ba324-84d7-4798-a531-a730a243d7e7","subject":"legacy-runtime"},"args_hash":"sha256:434a573d76d7b72dacf5be09730119950b6aaf5e7d9399fce001bc223ec2e61d","effect":null,"payload":{"approvers":[],"exp":3372890870,"kid":"awO8mlD8O09cHKMjkc5qLHAG0uQ2mFUWhqEiahMdaoQ"},"policy":{"id":"refunds","revision":"sha256:553efea08b58f2e43e18f5c0baa5b466a7c48b47beba039bc2e7a8721d6f911c","version":"1.0.0-upgrade-fixture"},"prev_hash":"sha256:343d22c750e5008591da30e361ea27d3ab1eb44458f16334116cd2e0e926b724","schema_version":1,"seq":5,"subject":{"decision_id":"c661a86d-2dac-4fe3-8ff4-517f0cfdcefe","permit_jti":"5763875825a44437b522d25ff17eb6cf","run_id":"run-legacy"},"tenant":"legacy","time":"2026-12-01T02:07:50.032317Z","tool":"issue_refund","type":"permit.minted"}', 'sha256:77c47861c24f5ac680afaf037c4e1071a3754d56f926ae8d2479eff9ec4b76e1');
INSERT INTO public.audit_events VALUES (9, 'legacy', 6, 'decision.made', '2026-12-01 02:07:50.074637+00', 'f3a4ced9-845f-44a4-a789-3f88a2209c80', NULL, NULL, 'run-legacy', 'issue_refund', 'allow', 'customer-42', 'refunds', '1.0.0-upgrade-fixture', '{"actor":{"kind":"key","principal_id":"745ba324-84d7-4798-a531-a730a243d7e7","subject":"legacy-runtime"},"args_hash":"sha256:4541eee1d8d25d4bc51b655979acc5964612149b22319ca98619cd273fe0d4f2","effect":"allow","payload":{"args":{"amount_minor":6000,"currency":"USD","order_id":"ord_6000","reason_code":"duplicate_charge"},"context":{},"eval_us":31,"initiator":{"id":"support-agent","type":"agent"},"principal":{"id":"customer-42","type":"customer"},"reasons":[{"code":"within_auto_limit","message":"refund within the automatic limit"}],"request_id":"legacy-allow-used","run":{"id":"run-legacy","step":2},"tool":{"name":"issue_refund","side_effect":"financial"}},"policy":{"id":"refunds","revision":"sha256:553efea08b58f2e43e18f5c0baa5b466a7c48b47beba039bc2e7a8721d6f911c","version":"1.0.0-upgrade-fixture"},"prev_hash":"sha256:77c47861c24f5ac680afaf037c4e1071a3754d56f926ae8d2479eff9ec4b76e1","schema_version":1,"seq":6,"subject":{"decision_id":"f3a4ced9-845f-44a4-a789-3f88a2209c80","run_id":"run-legacy"},"tenant":"legacy","time":"2026-12-01T02:07:50.074637Z","tool":"issue_refund","type":"decision.made"}', 'sha256:ffc11d38b1fb99c025dbc209667c8ef22ec19f00fec499abb449a60e7390011e');
INSERT INTO public.audit_events VALUES (10, 'legacy', 7, 'permit.minted', '2026-12-01 02:07:50.074637+00', 'f3a4ced9-845f-44a4-a789-3f88a2209c80', NULL, '63dddd965400496583e3a1d9ad10e4fd', 'run-legacy', 'issue_refund', NULL, NULL, 'refunds', '1.0.0-upgrade-fixture', '{"actor":{"kind":"key","principal_id":"745ba324-84d7-4798-a531-a730a243d7e7","subject":"legacy-runtime"},"args_hash":"sha256:4541eee1d8d25d4bc51b655979acc5964612149b22319ca98619cd273fe0d4f2","effect":null,"payload":{"approvers":[],"exp":3372890870,"kid":"awO8mlD8O09cHKMjkc5qLHAG0uQ2mFUWhqEiahMdaoQ"},"policy":{"id":"refunds","revision":"sha256:553efea08b58f2e43e18f5c0baa5b466a7c48b47beba039bc2e7a8721d6f911c","version":"1.0.0-upgrade-fixture"},"prev_hash":"sha256:ffc11d38b1fb99c025dbc209667c8ef22ec19f00fec499abb449a60e7390011e","schema_version":1,"seq":7,"subject":{"decision_id":"f3a4ced9-845f-44a4-a789-3f88a2209c80","permit_jti":"63dddd965400496583e3a1d9ad10e4fd","run_id":"run-legacy"},"tenant":"legacy","time":"2026-12-01T02:07:50.074637Z","tool":"issue_refund","type":"permit.minted"}', 'sha256:e014e776bdddcb55e91383584a62f3c627ca63f7b1ad8cea883133f792c5d72c');
INSERT INTO public.audit_events VALUES (11, 'legacy', 8, 'permit.redeemed', '2026-12-01 02:07:50.118244+00', 'f3a4ced9-845f-44a4-a789-3f88a2209c80', NULL, '63dddd965400496583e3a1d9ad10e4fd', 'run-legacy', 'issue_refund', NULL, NULL, 'refunds', '1.0.0-upgrade-fixture', '{"actor":{"kind":"key","principal_id":"745ba324-84d7-4798-a531-a730a243d7e7","subject":"legacy-runtime"},"args_hash":"sha256:4541eee1d8d25d4bc51b655979acc5964612149b22319ca98619cd273fe0d4f2","effect":null,"payload":{},"policy":{"id":"refunds","revision":"sha256:553efea08b58f2e43e18f5c0baa5b466a7c48b47beba039bc2e7a8721d6f911c","version":"1.0.0-upgrade-fixture"},"prev_hash":"sha256:e014e776bdddcb55e91383584a62f3c627ca63f7b1ad8cea883133f792c5d72c","schema_version":1,"seq":8,"subject":{"decision_id":"f3a4ced9-845f-44a4-a789-3f88a2209c80","permit_jti":"63dddd965400496583e3a1d9ad10e4fd","run_id":"run-legacy"},"tenant":"legacy","time":"2026-12-01T02:07:50.118244Z","tool":"issue_refund","type":"permit.redeemed"}', 'sha256:c8888e5037fff81e0f8a904ee99d13b4fec8839bc1aef9c6c55514dba6171d8b');
INSERT INTO public.audit_events VALUES (12, 'legacy', 9, 'decision.made', '2026-12-01 02:07:50.164698+00', '73dcfb13-7efc-4c8c-b3a4-4fa80e10ce5c', NULL, NULL, 'run-legacy', 'issue_refund', 'deny', 'customer-42', 'refunds', '1.0.0-upgrade-fixture', '{"actor":{"kind":"key","principal_id":"745ba324-84d7-4798-a531-a730a243d7e7","subject":"legacy-runtime"},"args_hash":"sha256:9392893eb3b837827f8b20c0d43be25a7b6812886f094d668695ce5d8746a392","effect":"deny","payload":{"args":{"amount_minor":250000,"currency":"USD","order_id":"ord_250000","reason_code":"duplicate_charge"},"context":{},"eval_us":33,"initiator":{"id":"support-agent","type":"agent"},"principal":{"id":"customer-42","type":"customer"},"reasons":[{"code":"over_hard_limit","message":"refunds above 200000 are not allowed"}],"request_id":"legacy-deny","run":{"id":"run-legacy","step":3},"tool":{"name":"issue_refund","side_effect":"financial"}},"policy":{"id":"refunds","revision":"sha256:553efea08b58f2e43e18f5c0baa5b466a7c48b47beba039bc2e7a8721d6f911c","version":"1.0.0-upgrade-fixture"},"prev_hash":"sha256:c8888e5037fff81e0f8a904ee99d13b4fec8839bc1aef9c6c55514dba6171d8b","schema_version":1,"seq":9,"subject":{"decision_id":"73dcfb13-7efc-4c8c-b3a4-4fa80e10ce5c","run_id":"run-legacy"},"tenant":"legacy","time":"2026-12-01T02:07:50.164698Z","tool":"issue_refund","type":"decision.made"}', 'sha256:25d4ef2f4eb4a74cc4c010aa15486fc005a4b877d51f67cdfea54e02e2aaef6e');
INSERT INTO public.audit_events VALUES (13, 'legacy', 10, 'decision.made', '2026-12-01 02:07:50.19749+00', '566a9650-56c3-4471-bae8-c96b456a5cb9', NULL, NULL, 'run-legacy', 'issue_refund', 'require_approval', 'customer-42', 'refunds', '1.0.0-upgrade-fixture', '{"actor":{"kind":"key","principal_id":"745ba324-84d7-4798-a531-a730a243d7e7","subject":"legacy-runtime"},"args_hash":"sha256:0a66ad5a8d1e1028f0f3df7744f56a8e7c1702c50cefc22cc8dd8685081a36c9","effect":"require_approval","payload":{"approval":{"distinct_from":"initiator_and_previous","expires_at":"2026-12-01T02:37:50.197490Z","id":"134ad6af-8ef2-4eeb-8226-b92253d4896a","progress":[{"approved":0,"count":1,"role":"finance"}],"require":[{"count":1,"role":"finance"}],"review_url":"http://127.0.0.1:8080/ui/approvals/134ad6af-8ef2-4eeb-8226-b92253d4896a","status":"pending"},"args":{"amount_minor":150000,"currency":"USD","order_id":"ord_150000","reason_code":"duplicate_charge"},"context":{},"eval_us":71,"initiator":{"id":"support-agent","type":"agent"},"principal":{"id":"customer-42","type":"customer"},"reasons":[{"code":"over_auto_limit","message":"refunds above 100000 need finance approval"}],"request_id":"legacy-approval","run":{"id":"run-legacy","step":4},"tool":{"name":"issue_refund","side_effect":"financial"}},"policy":{"id":"refunds","revision":"sha256:553efea08b58f2e43e18f5c0baa5b466a7c48b47beba039bc2e7a8721d6f911c","version":"1.0.0-upgrade-fixture"},"prev_hash":"sha256:25d4ef2f4eb4a74cc4c010aa15486fc005a4b877d51f67cdfea54e02e2aaef6e","schema_version":1,"seq":10,"subject":{"decision_id":"566a9650-56c3-4471-bae8-c96b456a5cb9","run_id":"run-legacy"},"tenant":"legacy","time":"2026-12-01T02:07:50.197490Z","tool":"issue_refund","type":"decision.made"}', 'sha256:420c02c70630a04613f965330e480d38af9fbc80ddfb47b582814fb2ab0cfcd2');
INSERT INTO public.audit_events VALUES (14, 'legacy', 11, 'approval.requested', '2026-12-01 02:07:50.19749+00', '566a9650-56c3-4471-bae8-c96b456a5cb9', '134ad6af-8ef2-4eeb-8226-b92253d4896a', NULL, 'run-legacy', 'issue_refund', NULL, NULL, 'refunds', '1.0.0-upgrade-fixture', '{"actor":{"kind":"key","principal_id":"745ba324-84d7-4798-a531-a730a243d7e7","subject":"legacy-runtime"},"args_hash":"sha256:0a66ad5a8d1e1028f0f3df7744f56a8e7c1702c50cefc22cc8dd8685081a36c9","effect":null,"payload":{"expires_at":"2026-12-01T02:37:50.197490+00:00","kind":"policy","reason":null,"requirement":{"distinct_from":"initiator_and_previous","require":[{"count":1,"role":"finance"}],"timeout_ms":1800000}},"policy":{"id":"refunds","revision":"sha256:553efea08b58f2e43e18f5c0baa5b466a7c48b47beba039bc2e7a8721d6f911c","version":"1.0.0-upgrade-fixture"},"prev_hash":"sha256:420c02c70630a04613f965330e480d38af9fbc80ddfb47b582814fb2ab0cfcd2","schema_version":1,"seq":11,"subject":{"approval_id":"134ad6af-8ef2-4eeb-8226-b92253d4896a","decision_id":"566a9650-56c3-4471-bae8-c96b456a5cb9","run_id":"run-legacy"},"tenant":"legacy","time":"2026-12-01T02:07:50.197490Z","tool":"issue_refund","type":"approval.requested"}', 'sha256:8b6a6cbbdeb6882b9f7d2b75dc59ceff693e9931ae681edb7276b1d8706e7397');
INSERT INTO public.audit_events VALUES (15, 'legacy', 12, 'approval.reviewed', '2026-12-01 02:07:50.244474+00', '566a9650-56c3-4471-bae8-c96b456a5cb9', '134ad6af-8ef2-4eeb-8226-b92253d4896a', NULL, 'run-legacy', 'issue_refund', NULL, NULL, 'refunds', '1.0.0-upgrade-fixture', '{"actor":{"kind":"key","principal_id":"d3aa981e-180c-45da-84fa-ef8b8702c043","subject":"legacy-finance"},"args_hash":"sha256:0a66ad5a8d1e1028f0f3df7744f56a8e7c1702c50cefc22cc8dd8685081a36c9","effect":null,"payload":{"comment":"double charge","decision":"approved","progress":[{"approved":1,"count":1,"role":"finance"}],"role":"finance"},"policy":{"id":"refunds","revision":"sha256:553efea08b58f2e43e18f5c0baa5b466a7c48b47beba039bc2e7a8721d6f911c","version":"1.0.0-upgrade-fixture"},"prev_hash":"sha256:8b6a6cbbdeb6882b9f7d2b75dc59ceff693e9931ae681edb7276b1d8706e7397","schema_version":1,"seq":12,"subject":{"approval_id":"134ad6af-8ef2-4eeb-8226-b92253d4896a","decision_id":"566a9650-56c3-4471-bae8-c96b456a5cb9","run_id":"run-legacy"},"tenant":"legacy","time":"2026-12-01T02:07:50.244474Z","tool":"issue_refund","type":"approval.reviewed"}', 'sha256:ff16ccb47241aa5eaa8bf4bc13688b3a697c9415c694dd1c66c6e2afdff6c871');
INSERT INTO public.audit_events VALUES (16, 'legacy', 13, 'approval.approved', '2026-12-01 02:07:50.244474+00', '566a9650-56c3-4471-bae8-c96b456a5cb9', '134ad6af-8ef2-4eeb-8226-b92253d4896a', NULL, 'run-legacy', 'issue_refund', NULL, NULL, 'refunds', '1.0.0-upgrade-fixture', '{"actor":{"kind":"key","principal_id":"d3aa981e-180c-45da-84fa-ef8b8702c043","subject":"legacy-finance"},"args_hash":"sha256:0a66ad5a8d1e1028f0f3df7744f56a8e7c1702c50cefc22cc8dd8685081a36c9","effect":null,"payload":{"approvers":[{"at":"2026-12-01T02:07:50.244474+00:00","id":"legacy-finance","role":"finance"}]},"policy":{"id":"refunds","revision":"sha256:553efea08b58f2e43e18f5c0baa5b466a7c48b47beba039bc2e7a8721d6f911c","version":"1.0.0-upgrade-fixture"},"prev_hash":"sha256:ff16ccb47241aa5eaa8bf4bc13688b3a697c9415c694dd1c66c6e2afdff6c871","schema_version":1,"seq":13,"subject":{"approval_id":"134ad6af-8ef2-4eeb-8226-b92253d4896a","decision_id":"566a9650-56c3-4471-bae8-c96b456a5cb9","run_id":"run-legacy"},"tenant":"legacy","time":"2026-12-01T02:07:50.244474Z","tool":"issue_refund","type":"approval.approved"}', 'sha256:9775b1f9a83061a0447229d59341d8c44ca122e2261b456abfead460e1bdfb30');
INSERT INTO public.audit_events VALUES (17, 'legacy', 14, 'permit.minted', '2026-12-01 02:07:50.244474+00', '566a9650-56c3-4471-bae8-c96b456a5cb9', '134ad6af-8ef2-4eeb-8226-b92253d4896a', 'f4868f3a565643e8a2e31410d76391d7', 'run-legacy', 'issue_refund', NULL, NULL, 'refunds', '1.0.0-upgrade-fixture', '{"actor":{"kind":"key","principal_id":"d3aa981e-180c-45da-84fa-ef8b8702c043","subject":"legacy-finance"},"args_hash":"sha256:0a66ad5a8d1e1028f0f3df7744f56a8e7c1702c50cefc22cc8dd8685081a36c9","effect":null,"payload":{"approvers":[{"at":1796090870,"id":"legacy-finance","role":"finance"}],"exp":1796092669,"kid":"awO8mlD8O09cHKMjkc5qLHAG0uQ2mFUWhqEiahMdaoQ"},"policy":{"id":"refunds","revision":"sha256:553efea08b58f2e43e18f5c0baa5b466a7c48b47beba039bc2e7a8721d6f911c","version":"1.0.0-upgrade-fixture"},"prev_hash":"sha256:9775b1f9a83061a0447229d59341d8c44ca122e2261b456abfead460e1bdfb30","schema_version":1,"seq":14,"subject":{"approval_id":"134ad6af-8ef2-4eeb-8226-b92253d4896a","decision_id":"566a9650-56c3-4471-bae8-c96b456a5cb9","permit_jti":"f4868f3a565643e8a2e31410d76391d7","run_id":"run-legacy"},"tenant":"legacy","time":"2026-12-01T02:07:50.244474Z","tool":"issue_refund","type":"permit.minted"}', 'sha256:c03225421a8c160aeed80fcffb53a45d235d129956bea2b73a46d45c3b7a6522');


--
-- Data for Name: audit_heads; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.audit_heads VALUES ('_system', 3, 'sha256:94d2e7fde5f9e6fce86ff76fec48eef4abf3578ff1f43deda2fb9f8cf3cca0bc');
INSERT INTO public.audit_heads VALUES ('legacy', 14, 'sha256:c03225421a8c160aeed80fcffb53a45d235d129956bea2b73a46d45c3b7a6522');


--
-- Data for Name: call_inputs; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.call_inputs VALUES ('c661a86d-2dac-4fe3-8ff4-517f0cfdcefe', 'legacy', '{"tenant":"legacy","principal":{"id":"customer-42","type":"customer"},"initiator":{"id":"support-agent","type":"agent"},"caller":{"subject":"legacy-runtime","roles":["runtime"]},"tool":{"name":"issue_refund","side_effect":"financial"},"args":{"order_id":"ord_5000","amount_minor":5000,"currency":"USD","reason_code":"duplicate_charge"},"context":{},"run":{"id":"run-legacy","step":1}}', '[]');
INSERT INTO public.call_inputs VALUES ('f3a4ced9-845f-44a4-a789-3f88a2209c80', 'legacy', '{"tenant":"legacy","principal":{"id":"customer-42","type":"customer"},"initiator":{"id":"support-agent","type":"agent"},"caller":{"subject":"legacy-runtime","roles":["runtime"]},"tool":{"name":"issue_refund","side_effect":"financial"},"args":{"order_id":"ord_6000","amount_minor":6000,"currency":"USD","reason_code":"duplicate_charge"},"context":{},"run":{"id":"run-legacy","step":2}}', '[]');
INSERT INTO public.call_inputs VALUES ('566a9650-56c3-4471-bae8-c96b456a5cb9', 'legacy', '{"tenant":"legacy","principal":{"id":"customer-42","type":"customer"},"initiator":{"id":"support-agent","type":"agent"},"caller":{"subject":"legacy-runtime","roles":["runtime"]},"tool":{"name":"issue_refund","side_effect":"financial"},"args":{"order_id":"ord_150000","amount_minor":150000,"currency":"USD","reason_code":"duplicate_charge"},"context":{},"run":{"id":"run-legacy","step":4}}', '[]');


--
-- Data for Name: decision_outcomes; Type: TABLE DATA; Schema: public; Owner: -
--



--
-- Data for Name: decisions; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.decisions VALUES ('c661a86d-2dac-4fe3-8ff4-517f0cfdcefe', 'legacy', 'legacy-allow-kept', 'sha256:3603a25f36aa277986750f018e2433b504baba1fe192eb55bad7b77d7e99b8e1', 'run-legacy', 'issue_refund', 'sha256:434a573d76d7b72dacf5be09730119950b6aaf5e7d9399fce001bc223ec2e61d', 'allow', 'legacy-runtime', 'refunds', '1.0.0-upgrade-fixture', 'sha256:553efea08b58f2e43e18f5c0baa5b466a7c48b47beba039bc2e7a8721d6f911c', '{"decision_id":"c661a86d-2dac-4fe3-8ff4-517f0cfdcefe","request_id":"legacy-allow-kept","effect":"allow","reasons":[{"code":"within_auto_limit","message":"refund within the automatic limit"}],"policy":{"id":"refunds","version":"1.0.0-upgrade-fixture","revision":"sha256:553efea08b58f2e43e18f5c0baa5b466a7c48b47beba039bc2e7a8721d6f911c"},"args_hash":"sha256:434a573d76d7b72dacf5be09730119950b6aaf5e7d9399fce001bc223ec2e61d","permit":{"token":"eyJhbGciOiJFZDI1NTE5Iiwia2lkIjoiYXdPOG1sRDhPMDljSEtNamtjNXFMSEFHMHVRMm1GVVdocUVpYWhNZGFvUSIsInR5cCI6ImNvc2lnbmVyLXBlcm1pdCtqd3QifQ.eyJpc3MiOiJjb3NpZ25lciIsImF1ZCI6ImNvc2lnbmVyLWV4ZWN1dG9yIiwianRpIjoiNTc2Mzg3NTgyNWE0NDQzN2I1MjJkMjVmZjE3ZWI2Y2YiLCJpYXQiOjE3OTYwOTA4NzAsIm5iZiI6MTc5NjA5MDg3MCwiZXhwIjozMzcyODkwODcwLCJ0ZW5hbnQiOiJsZWdhY3kiLCJydW4iOiJydW4tbGVnYWN5IiwiZGVjaXNpb25faWQiOiJjNjYxYTg2ZC0yZGFjLTRmZTMtOGZmNC01MTdmMGNmZGNlZmUiLCJ0b29sIjoiaXNzdWVfcmVmdW5kIiwiYXJnc19oYXNoIjoic2hhMjU2OjQzNGE1NzNkNzZkN2I3MmRhY2Y1YmUwOTczMDExOTk1MGI2YWFmNWU3ZDkzOTlmY2UwMDFiYzIyM2VjMmU2MWQiLCJwb2xpY3kiOnsiaWQiOiJyZWZ1bmRzIiwidmVyc2lvbiI6IjEuMC4wLXVwZ3JhZGUtZml4dHVyZSIsInJldmlzaW9uIjoic2hhMjU2OjU1M2VmZWEwOGI1OGYyZTQzZTE4ZjVjMGJhYTViNDY2YTdjNDhiNDdiZWJhMDM5YmMyZTdhODcyMWQ2ZjkxMWMifSwiYXBwcm92ZXJzIjpbXX0.r685K5PT6ZQchTcyzpEDQki3l_4fQS_AUsjut6LZONJ4PoaNCdQaGuq7JAFlmsVPk3u5Ve1HGiyuwFGZtDpeCg","jti":"5763875825a44437b522d25ff17eb6cf","expires_at":"2076-11-18T02:07:50Z"},"approval":null}', '2026-12-01 02:07:50.032317+00');
INSERT INTO public.decisions VALUES ('f3a4ced9-845f-44a4-a789-3f88a2209c80', 'legacy', 'legacy-allow-used', 'sha256:89f3084816abc55e606dbd2b00991eb4807c3e1741ed5b264b4344348fe89e51', 'run-legacy', 'issue_refund', 'sha256:4541eee1d8d25d4bc51b655979acc5964612149b22319ca98619cd273fe0d4f2', 'allow', 'legacy-runtime', 'refunds', '1.0.0-upgrade-fixture', 'sha256:553efea08b58f2e43e18f5c0baa5b466a7c48b47beba039bc2e7a8721d6f911c', '{"decision_id":"f3a4ced9-845f-44a4-a789-3f88a2209c80","request_id":"legacy-allow-used","effect":"allow","reasons":[{"code":"within_auto_limit","message":"refund within the automatic limit"}],"policy":{"id":"refunds","version":"1.0.0-upgrade-fixture","revision":"sha256:553efea08b58f2e43e18f5c0baa5b466a7c48b47beba039bc2e7a8721d6f911c"},"args_hash":"sha256:4541eee1d8d25d4bc51b655979acc5964612149b22319ca98619cd273fe0d4f2","permit":{"token":"eyJhbGciOiJFZDI1NTE5Iiwia2lkIjoiYXdPOG1sRDhPMDljSEtNamtjNXFMSEFHMHVRMm1GVVdocUVpYWhNZGFvUSIsInR5cCI6ImNvc2lnbmVyLXBlcm1pdCtqd3QifQ.eyJpc3MiOiJjb3NpZ25lciIsImF1ZCI6ImNvc2lnbmVyLWV4ZWN1dG9yIiwianRpIjoiNjNkZGRkOTY1NDAwNDk2NTgzZTNhMWQ5YWQxMGU0ZmQiLCJpYXQiOjE3OTYwOTA4NzAsIm5iZiI6MTc5NjA5MDg3MCwiZXhwIjozMzcyODkwODcwLCJ0ZW5hbnQiOiJsZWdhY3kiLCJydW4iOiJydW4tbGVnYWN5IiwiZGVjaXNpb25faWQiOiJmM2E0Y2VkOS04NDVmLTQ0YTQtYTc4OS0zZjg4YTIyMDljODAiLCJ0b29sIjoiaXNzdWVfcmVmdW5kIiwiYXJnc19oYXNoIjoic2hhMjU2OjQ1NDFlZWUxZDhkMjVkNGJjNTFiNjU1OTc5YWNjNTk2NDYxMjE0OWIyMjMxOWNhOTg2MTljZDI3M2ZlMGQ0ZjIiLCJwb2xpY3kiOnsiaWQiOiJyZWZ1bmRzIiwidmVyc2lvbiI6IjEuMC4wLXVwZ3JhZGUtZml4dHVyZSIsInJldmlzaW9uIjoic2hhMjU2OjU1M2VmZWEwOGI1OGYyZTQzZTE4ZjVjMGJhYTViNDY2YTdjNDhiNDdiZWJhMDM5YmMyZTdhODcyMWQ2ZjkxMWMifSwiYXBwcm92ZXJzIjpbXX0.yO3dN62EgomMROwCorsyk9xHucQszXbnqtIk3NyVdLA-z0f6G3KPGT3DS6AxPXV2SCzAZtQqMFHGenxi4cCgAg","jti":"63dddd965400496583e3a1d9ad10e4fd","expires_at":"2076-11-18T02:07:50Z"},"approval":null}', '2026-12-01 02:07:50.074637+00');
INSERT INTO public.decisions VALUES ('73dcfb13-7efc-4c8c-b3a4-4fa80e10ce5c', 'legacy', 'legacy-deny', 'sha256:7508583d72dbd12043a40f05f45bb714feea2dd30b36bfc9c1875de0028eec03', 'run-legacy', 'issue_refund', 'sha256:9392893eb3b837827f8b20c0d43be25a7b6812886f094d668695ce5d8746a392', 'deny', 'legacy-runtime', 'refunds', '1.0.0-upgrade-fixture', 'sha256:553efea08b58f2e43e18f5c0baa5b466a7c48b47beba039bc2e7a8721d6f911c', '{"decision_id":"73dcfb13-7efc-4c8c-b3a4-4fa80e10ce5c","request_id":"legacy-deny","effect":"deny","reasons":[{"code":"over_hard_limit","message":"refunds above 200000 are not allowed"}],"policy":{"id":"refunds","version":"1.0.0-upgrade-fixture","revision":"sha256:553efea08b58f2e43e18f5c0baa5b466a7c48b47beba039bc2e7a8721d6f911c"},"args_hash":"sha256:9392893eb3b837827f8b20c0d43be25a7b6812886f094d668695ce5d8746a392","permit":null,"approval":null}', '2026-12-01 02:07:50.164698+00');
INSERT INTO public.decisions VALUES ('566a9650-56c3-4471-bae8-c96b456a5cb9', 'legacy', 'legacy-approval', 'sha256:3177b7fb440f6decaad3b58469a000485e4b8a40f17fea1797ba0f5d2552b06a', 'run-legacy', 'issue_refund', 'sha256:0a66ad5a8d1e1028f0f3df7744f56a8e7c1702c50cefc22cc8dd8685081a36c9', 'require_approval', 'legacy-runtime', 'refunds', '1.0.0-upgrade-fixture', 'sha256:553efea08b58f2e43e18f5c0baa5b466a7c48b47beba039bc2e7a8721d6f911c', '{"decision_id":"566a9650-56c3-4471-bae8-c96b456a5cb9","request_id":"legacy-approval","effect":"require_approval","reasons":[{"code":"over_auto_limit","message":"refunds above 100000 need finance approval"}],"policy":{"id":"refunds","version":"1.0.0-upgrade-fixture","revision":"sha256:553efea08b58f2e43e18f5c0baa5b466a7c48b47beba039bc2e7a8721d6f911c"},"args_hash":"sha256:0a66ad5a8d1e1028f0f3df7744f56a8e7c1702c50cefc22cc8dd8685081a36c9","permit":null,"approval":{"id":"134ad6af-8ef2-4eeb-8226-b92253d4896a","status":"pending","require":[{"role":"finance","count":1}],"progress":[{"role":"finance","count":1,"approved":0}],"distinct_from":"initiator_and_previous","expires_at":"2026-12-01T02:37:50.197490Z","review_url":"http://127.0.0.1:8080/ui/approvals/134ad6af-8ef2-4eeb-8226-b92253d4896a"}}', '2026-12-01 02:07:50.19749+00');


--
-- Data for Name: permits; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.permits VALUES ('5763875825a44437b522d25ff17eb6cf', 'legacy', 'c661a86d-2dac-4fe3-8ff4-517f0cfdcefe', NULL, 'run-legacy', 'issue_refund', 'sha256:434a573d76d7b72dacf5be09730119950b6aaf5e7d9399fce001bc223ec2e61d', 'issued', '2026-12-01 02:07:50.032317+00', '2076-11-18 02:07:50+00', NULL, NULL);
INSERT INTO public.permits VALUES ('63dddd965400496583e3a1d9ad10e4fd', 'legacy', 'f3a4ced9-845f-44a4-a789-3f88a2209c80', NULL, 'run-legacy', 'issue_refund', 'sha256:4541eee1d8d25d4bc51b655979acc5964612149b22319ca98619cd273fe0d4f2', 'redeemed', '2026-12-01 02:07:50.074637+00', '2076-11-18 02:07:50+00', '2026-12-01 02:07:50.118244+00', NULL);
INSERT INTO public.permits VALUES ('f4868f3a565643e8a2e31410d76391d7', 'legacy', '566a9650-56c3-4471-bae8-c96b456a5cb9', '134ad6af-8ef2-4eeb-8226-b92253d4896a', 'run-legacy', 'issue_refund', 'sha256:0a66ad5a8d1e1028f0f3df7744f56a8e7c1702c50cefc22cc8dd8685081a36c9', 'issued', '2026-12-01 02:07:50.244474+00', '2026-12-01 02:37:49+00', NULL, NULL);


--
-- Data for Name: principals; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.principals VALUES ('745ba324-84d7-4798-a531-a730a243d7e7', 'legacy', 'legacy-runtime', 'key', '["runtime"]', NULL, false, '2026-12-01 02:07:42.361512+00');
INSERT INTO public.principals VALUES ('d3aa981e-180c-45da-84fa-ef8b8702c043', 'legacy', 'legacy-finance', 'key', '["finance"]', NULL, false, '2026-12-01 02:07:43.527455+00');
INSERT INTO public.principals VALUES ('af2ab2fe-7102-44ee-8bac-7eee196ff7ef', 'legacy', 'legacy-auditor', 'key', '["auditor"]', NULL, false, '2026-12-01 02:07:44.850773+00');


--
-- Data for Name: reviews; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.reviews VALUES ('38a7ab69-e056-4c5a-a80c-7848f2a8e866', '134ad6af-8ef2-4eeb-8226-b92253d4896a', 'legacy', 'run-legacy', 'legacy-finance', 'd3aa981e-180c-45da-84fa-ef8b8702c043', '["finance"]', 'finance', 'approved', 'double charge', '2026-12-01 02:07:50.244474+00');


--
-- Data for Name: runs; Type: TABLE DATA; Schema: public; Owner: -
--



--
-- Data for Name: signin_failures; Type: TABLE DATA; Schema: public; Owner: -
--



--
-- Data for Name: web_sessions; Type: TABLE DATA; Schema: public; Owner: -
--



--
-- Data for Name: webhook_attempts; Type: TABLE DATA; Schema: public; Owner: -
--



--
-- Data for Name: webhook_deliveries; Type: TABLE DATA; Schema: public; Owner: -
--



--
-- Name: audit_events_id_seq; Type: SEQUENCE SET; Schema: public; Owner: -
--

SELECT pg_catalog.setval('public.audit_events_id_seq', 17, true);


--
-- Name: webhook_attempts_id_seq; Type: SEQUENCE SET; Schema: public; Owner: -
--

SELECT pg_catalog.setval('public.webhook_attempts_id_seq', 1, false);


--
-- Name: alembic_version alembic_version_pkc; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.alembic_version
    ADD CONSTRAINT alembic_version_pkc PRIMARY KEY (version_num);


--
-- Name: api_keys api_keys_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.api_keys
    ADD CONSTRAINT api_keys_pkey PRIMARY KEY (id);


--
-- Name: approvals approvals_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.approvals
    ADD CONSTRAINT approvals_pkey PRIMARY KEY (id);


--
-- Name: audit_events audit_events_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.audit_events
    ADD CONSTRAINT audit_events_pkey PRIMARY KEY (id);


--
-- Name: audit_heads audit_heads_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.audit_heads
    ADD CONSTRAINT audit_heads_pkey PRIMARY KEY (tenant);


--
-- Name: call_inputs call_inputs_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.call_inputs
    ADD CONSTRAINT call_inputs_pkey PRIMARY KEY (decision_id);


--
-- Name: decision_outcomes decision_outcomes_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.decision_outcomes
    ADD CONSTRAINT decision_outcomes_pkey PRIMARY KEY (decision_id);


--
-- Name: decisions decisions_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.decisions
    ADD CONSTRAINT decisions_pkey PRIMARY KEY (id);


--
-- Name: permits permits_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.permits
    ADD CONSTRAINT permits_pkey PRIMARY KEY (jti);


--
-- Name: audit_checkpoints pk_audit_checkpoints; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.audit_checkpoints
    ADD CONSTRAINT pk_audit_checkpoints PRIMARY KEY (tenant, seq);


--
-- Name: principals principals_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.principals
    ADD CONSTRAINT principals_pkey PRIMARY KEY (id);


--
-- Name: reviews reviews_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.reviews
    ADD CONSTRAINT reviews_pkey PRIMARY KEY (id);


--
-- Name: runs runs_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.runs
    ADD CONSTRAINT runs_pkey PRIMARY KEY (tenant, run_id);


--
-- Name: signin_failures signin_failures_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.signin_failures
    ADD CONSTRAINT signin_failures_pkey PRIMARY KEY (key);


--
-- Name: audit_events uq_audit_events_tenant_seq; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.audit_events
    ADD CONSTRAINT uq_audit_events_tenant_seq UNIQUE (tenant, seq);


--
-- Name: decisions uq_decisions_tenant_request; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.decisions
    ADD CONSTRAINT uq_decisions_tenant_request UNIQUE (tenant, request_id);


--
-- Name: principals uq_principals_tenant_subject; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.principals
    ADD CONSTRAINT uq_principals_tenant_subject UNIQUE (tenant, subject);


--
-- Name: reviews uq_reviews_approval_subject; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.reviews
    ADD CONSTRAINT uq_reviews_approval_subject UNIQUE (approval_id, subject);


--
-- Name: web_sessions web_sessions_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.web_sessions
    ADD CONSTRAINT web_sessions_pkey PRIMARY KEY (id_hash);


--
-- Name: webhook_attempts webhook_attempts_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.webhook_attempts
    ADD CONSTRAINT webhook_attempts_pkey PRIMARY KEY (id);


--
-- Name: webhook_deliveries webhook_deliveries_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.webhook_deliveries
    ADD CONSTRAINT webhook_deliveries_pkey PRIMARY KEY (id);


--
-- Name: ix_approvals_decision; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ix_approvals_decision ON public.approvals USING btree (tenant, decision_id);


--
-- Name: ix_approvals_tenant_status; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ix_approvals_tenant_status ON public.approvals USING btree (tenant, status, expires_at);


--
-- Name: ix_audit_events_decision; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ix_audit_events_decision ON public.audit_events USING btree (tenant, decision_id);


--
-- Name: ix_audit_events_time; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ix_audit_events_time ON public.audit_events USING btree (tenant, "time");


--
-- Name: ix_permits_decision; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ix_permits_decision ON public.permits USING btree (decision_id);


--
-- Name: ix_reviews_run; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ix_reviews_run ON public.reviews USING btree (tenant, run_id, decision);


--
-- Name: ix_web_sessions_principal; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ix_web_sessions_principal ON public.web_sessions USING btree (principal_id);


--
-- Name: ix_webhook_attempts_delivery; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ix_webhook_attempts_delivery ON public.webhook_attempts USING btree (delivery_id);


--
-- Name: ix_webhook_deliveries_due; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ix_webhook_deliveries_due ON public.webhook_deliveries USING btree (status, next_attempt_at);


--
-- Name: uq_approvals_pending_call; Type: INDEX; Schema: public; Owner: -
--

CREATE UNIQUE INDEX uq_approvals_pending_call ON public.approvals USING btree (tenant, run_id, tool, args_hash) WHERE ((status)::text = 'pending'::text);


--
-- Name: api_keys api_keys_principal_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.api_keys
    ADD CONSTRAINT api_keys_principal_id_fkey FOREIGN KEY (principal_id) REFERENCES public.principals(id);


--
-- Name: web_sessions web_sessions_principal_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.web_sessions
    ADD CONSTRAINT web_sessions_principal_id_fkey FOREIGN KEY (principal_id) REFERENCES public.principals(id);


--
-- Name: webhook_attempts webhook_attempts_delivery_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.webhook_attempts
    ADD CONSTRAINT webhook_attempts_delivery_id_fkey FOREIGN KEY (delivery_id) REFERENCES public.webhook_deliveries(id);


--
-- PostgreSQL database dump complete
--

\unrestrict sis1DXLHX02DYj9u3BWOXRwa2LCffYVdioCLx7oOwLc5eZ2YCdKQJ292decsLVY

