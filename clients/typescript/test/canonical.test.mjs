// RFC 8785 golden vectors shared with the server and the Python client.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { argsHash, argsHashOfJson, canonicalize, parseJson, InvalidArguments } from "../dist/index.js";

const vectors = JSON.parse(readFileSync(new URL("../../../tests/canonical_vectors.json", import.meta.url), "utf8"));

test("golden vectors: accepted texts hash byte-identically to the server", () => {
  assert.ok(vectors.accept.length >= 10);
  for (const v of vectors.accept) {
    assert.equal(argsHashOfJson(v.json), v.hash, v.description);
    assert.equal(argsHashOfJson(Buffer.from(v.json, "utf8")), v.hash, v.description);
  }
});

test("golden vectors: canonical text is byte-identical", () => {
  for (const v of vectors.accept) {
    const value = parseJson(v.json);
    let text;
    try {
      text = canonicalize(value);
    } catch (exc) {
      // Only an integral number in [2**53, 1e21) parsed from a float literal is refused as a
      // JS value (its literal form is gone); the text path above hashed it.
      assert.equal(exc.code, "unsafe_integer", v.description);
      continue;
    }
    assert.equal(text, v.canonical, v.description);
    assert.equal(argsHash(value), v.hash, v.description);
  }
});

test("golden vectors: rejected texts give the server's codes", () => {
  assert.ok(vectors.reject.length >= 5);
  for (const v of vectors.reject) {
    assert.throws(() => argsHashOfJson(v.json), (exc) => exc instanceof InvalidArguments && exc.code === v.code, v.description);
  }
});

test("JSON.parse would keep the last duplicate; the strict parse refuses it", () => {
  assert.deepEqual(JSON.parse('{"a":1,"a":2}'), { a: 2 });
  assert.throws(() => parseJson('{"a":1,"a":2}'), { code: "duplicate_key" });
  assert.throws(() => parseJson('{"x":{"__proto__":1,"__proto__":2}}'), { code: "duplicate_key" });
  assert.deepEqual(Object.keys(parseJson('{"__proto__":1}')), ["__proto__"]);
});

test("JS values: the server's refusals, before any network call", () => {
  const cases = [
    [{ a: NaN }, "non_finite_number", "/a"],
    [{ a: [1, Infinity] }, "non_finite_number", "/a/1"],
    [{ id: 2 ** 53 }, "unsafe_integer", "/id"],
    [{ s: "\ud800" }, "invalid_json", "/s"],
    [{ "\udc00": 1 }, "invalid_json", "/\\u?"],
    [{ d: new Date(0) }, "invalid_json", "/d"],
    [{ u: undefined }, "invalid_json", "/u"],
    [{ b: 1n }, "invalid_json", "/b"],
    [{ m: new Map() }, "invalid_json", "/m"],
    [{ h: [1, , 3] }, "invalid_json", "/h/1"],
  ];
  for (const [value, code, pointer] of cases) {
    assert.throws(() => argsHash(value), (exc) => exc instanceof InvalidArguments && exc.code === code && exc.pointer === pointer, `${code} ${pointer}`);
  }
  // Safe integers, 1e21 and above (written as floats), and paired surrogates are fine.
  assert.equal(canonicalize({ n: 2 ** 53 - 1, big: 1e21, e: "\ud83d\ude00" }), '{"big":1e+21,"e":"😀","n":9007199254740991}');
});
