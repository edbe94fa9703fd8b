/**
 * RFC 8785 (JSON Canonicalization Scheme) and the args hash, byte-identical with the
 * server (`cosigner.core.canonical`) and the Python client, with the same strict refusals.
 *
 * Serialisation is the maintained `canonicalize` package; before it, a strict check
 * refuses what the server refuses (codes as the server's):
 *
 * - `unsafe_integer`: an integer outside ±(2**53 − 1). From JSON text ({@link parseJson},
 *   {@link argsHashOfJson}) this is decided on the literal, exactly like the server. For a
 *   JS value, a number cannot say whether it was written as an integer, so an integral
 *   number in [2**53, 1e21) is refused: `JSON.stringify` writes it as an integer literal,
 *   which the server would refuse (send large identifiers as strings);
 * - `non_finite_number`: NaN, ±Infinity, or a literal overflowing to infinity;
 * - `duplicate_key` (JSON text only: a JS object cannot hold one, so raw text must be
 *   parsed strictly — `JSON.parse` silently keeps the last);
 * - `invalid_json`: a lone surrogate in a string or key, a value that is not plain JSON
 *   data (undefined, functions, symbols, bigint, Date, Map, class instances, array
 *   holes), nesting deeper than 1000, or text that is not JSON.
 */

import { createHash } from "node:crypto";
import canonicalizeLib from "canonicalize";
import { InvalidArguments } from "./errors.js";

export const MAX_SAFE_INTEGER = Number.MAX_SAFE_INTEGER; // 2**53 - 1
const MAX_DEPTH = 1000;
const LONE_SURROGATE = /[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/;

export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

class Reject extends Error {
  path: string[] = [];
  constructor(readonly code: string, readonly what: string) {
    super(what);
  }
}

function segment(key: string): string {
  const seg = key.replace(/~/g, "~0").replace(/\//g, "~1").replace(LONE_SURROGATE, "\\u?");
  return seg.length <= 64 ? seg : seg.slice(0, 64) + "…";
}

function fail(exc: Reject): never {
  const pointer = exc.path.reverse().map((s) => "/" + s).join("");
  const where = pointer ? `at '${pointer}'` : "at the top level";
  throw new InvalidArguments(`${exc.what} ${where}`, exc.code, { pointer });
}

function isPlainObject(value: object): boolean {
  const proto = Object.getPrototypeOf(value);
  return proto === Object.prototype || proto === null;
}

function check(value: unknown, depth: number): void {
  if (depth > MAX_DEPTH) throw new Reject("invalid_json", "value is nested too deeply");
  switch (typeof value) {
    case "string":
      if (LONE_SURROGATE.test(value)) throw new Reject("invalid_json", "lone surrogate in string");
      return;
    case "boolean":
      return;
    case "number":
      if (!Number.isFinite(value)) throw new Reject("non_finite_number", "NaN or infinite number");
      if (Number.isInteger(value) && !Number.isSafeInteger(value) && Math.abs(value) < 1e21) {
        throw new Reject("unsafe_integer", "integer outside ±(2**53 - 1); send large identifiers as strings");
      }
      return;
    case "object": {
      if (value === null) return;
      if (Array.isArray(value)) {
        for (let i = 0; i < value.length; i++) {
          try {
            if (!(i in value)) throw new Reject("invalid_json", "array hole is not JSON");
            check(value[i], depth + 1);
          } catch (exc) {
            if (exc instanceof Reject) exc.path.push(String(i));
            throw exc;
          }
        }
        return;
      }
      if (!isPlainObject(value)) {
        throw new Reject("invalid_json", `value of type ${value.constructor?.name ?? "object"} is not JSON`);
      }
      for (const key of Object.keys(value)) {
        try {
          if (LONE_SURROGATE.test(key)) throw new Reject("invalid_json", "lone surrogate in object key");
          check((value as Record<string, unknown>)[key], depth + 1);
        } catch (exc) {
          if (exc instanceof Reject) exc.path.push(segment(key));
          throw exc;
        }
      }
      return;
    }
    default:
      throw new Reject("invalid_json", `value of type ${typeof value} is not JSON`);
  }
}

/** Throw {@link InvalidArguments} unless `value` has exactly one canonical form. */
export function checkHashable(value: unknown): asserts value is Json {
  try {
    check(value, 0);
  } catch (exc) {
    if (exc instanceof Reject) fail(exc);
    throw exc;
  }
}

/** RFC 8785 canonical text of `value` (checked first). */
export function canonicalize(value: unknown): string {
  checkHashable(value);
  return canonicalText(value);
}

function canonicalText(value: Json): string {
  const text = (canonicalizeLib as (v: unknown) => string | undefined)(value);
  if (text === undefined) throw new InvalidArguments("value is not JSON", "invalid_json");
  return text;
}

function hashText(text: string): string {
  return "sha256:" + createHash("sha256").update(text, "utf8").digest("hex");
}

/** `"sha256:" + hex(SHA-256(canonical(args)))`: the binding hash of a permit. */
export function argsHash(args: unknown): string {
  return hashText(canonicalize(args));
}

/** The args hash of JSON text, parsed strictly as the server parses request bodies. */
export function argsHashOfJson(text: string | Uint8Array): string {
  return hashText(canonicalText(parseJson(text)));
}

// --------------------------------------------------------------------------- strict parse

const WS = new Set([" ", "\t", "\n", "\r"]);
const NUMBER = /-?(?:0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?/y;
const ESCAPES: Record<string, string> = { '"': '"', "\\": "\\", "/": "/", b: "\b", f: "\f", n: "\n", r: "\r", t: "\t" };

class Parser {
  i = 0;
  constructor(readonly s: string) {}

  bad(what: string): never {
    throw new InvalidArguments(`invalid JSON: ${what} (char ${this.i})`, "invalid_json");
  }

  ws(): void {
    while (this.i < this.s.length && WS.has(this.s[this.i]!)) this.i++;
  }

  value(depth: number): Json {
    if (depth > MAX_DEPTH) throw new InvalidArguments("JSON is nested too deeply", "invalid_json");
    this.ws();
    const c = this.s[this.i];
    if (c === "{") return this.object(depth);
    if (c === "[") return this.array(depth);
    if (c === '"') return this.string();
    for (const [word, val] of [["true", true], ["false", false], ["null", null]] as const) {
      if (this.s.startsWith(word, this.i)) {
        this.i += word.length;
        return val;
      }
    }
    for (const word of ["NaN", "Infinity", "-Infinity"]) {
      if (this.s.startsWith(word, this.i)) {
        throw new InvalidArguments(`${word} is not a JSON number`, "non_finite_number");
      }
    }
    return this.number();
  }

  number(): number {
    NUMBER.lastIndex = this.i;
    const m = NUMBER.exec(this.s);
    if (!m) this.bad("expecting value");
    const literal = m[0];
    this.i += literal.length;
    const value = Number(literal);
    if (m[1] === undefined && m[2] === undefined) {
      // An integer literal: refused outside ±(2**53 - 1), decided on the exact digits.
      const digits = literal.replace("-", "").replace(/^0+(?=\d)/, "");
      if (digits.length > 16 || BigInt(digits) > BigInt(MAX_SAFE_INTEGER)) {
        throw new InvalidArguments("integer literal outside ±(2**53 - 1); send large identifiers as strings", "unsafe_integer");
      }
      return value;
    }
    if (!Number.isFinite(value)) throw new InvalidArguments("number literal overflows to infinity", "non_finite_number");
    return value;
  }

  string(): string {
    this.i++; // opening quote
    let out = "";
    for (;;) {
      const c = this.s[this.i];
      if (c === undefined) this.bad("unterminated string");
      if (c === '"') {
        this.i++;
        return out;
      }
      if (c === "\\") {
        const e = this.s[this.i + 1];
        if (e === "u") {
          const hex = this.s.slice(this.i + 2, this.i + 6);
          if (!/^[0-9a-fA-F]{4}$/.test(hex)) this.bad("invalid \\u escape");
          out += String.fromCharCode(parseInt(hex, 16));
          this.i += 6;
        } else if (e !== undefined && e in ESCAPES) {
          out += ESCAPES[e];
          this.i += 2;
        } else {
          this.bad("invalid escape");
        }
        continue;
      }
      if (c < " ") this.bad("control character in string");
      out += c;
      this.i++;
    }
  }

  array(depth: number): Json[] {
    this.i++;
    const out: Json[] = [];
    this.ws();
    if (this.s[this.i] === "]") {
      this.i++;
      return out;
    }
    for (;;) {
      out.push(this.value(depth + 1));
      this.ws();
      const c = this.s[this.i++];
      if (c === "]") return out;
      if (c !== ",") this.bad("expecting ',' or ']'");
    }
  }

  object(depth: number): { [key: string]: Json } {
    this.i++;
    const pairs: [string, Json][] = [];
    this.ws();
    if (this.s[this.i] === "}") {
      this.i++;
      return {};
    }
    for (;;) {
      this.ws();
      if (this.s[this.i] !== '"') this.bad("expecting property name in double quotes");
      const key = this.string();
      this.ws();
      if (this.s[this.i++] !== ":") this.bad("expecting ':'");
      pairs.push([key, this.value(depth + 1)]);
      this.ws();
      const c = this.s[this.i++];
      if (c === "}") break;
      if (c !== ",") this.bad("expecting ',' or '}'");
    }
    // Like the server, duplicates are looked for when the object is complete.
    const out: { [key: string]: Json } = {};
    const seen = new Set<string>();
    for (const [key, value] of pairs) {
      if (seen.has(key)) throw new InvalidArguments(`duplicate object key '${segment(key)}'`, "duplicate_key");
      seen.add(key);
      Object.defineProperty(out, key, { value, enumerable: true, writable: true, configurable: true });
    }
    return out;
  }
}

/**
 * Parse JSON text exactly as the server does: `invalid_json`, `duplicate_key`,
 * `non_finite_number`, `unsafe_integer` (thrown as {@link InvalidArguments}).
 */
export function parseJson(text: string | Uint8Array): Json {
  let s: string;
  if (typeof text === "string") {
    s = text;
  } else {
    try {
      s = new TextDecoder("utf-8", { fatal: true }).decode(text);
    } catch {
      throw new InvalidArguments("text is not valid UTF-8", "invalid_json");
    }
  }
  const p = new Parser(s);
  const value = p.value(0);
  p.ws();
  if (p.i !== s.length) p.bad("extra data");
  // Lone surrogates (raw or escaped); numbers were decided on their literals above.
  try {
    checkStrings(value);
  } catch (exc) {
    if (exc instanceof Reject) fail(exc);
    throw exc;
  }
  return value;
}

function checkStrings(value: Json): void {
  if (typeof value === "string") {
    if (LONE_SURROGATE.test(value)) throw new Reject("invalid_json", "lone surrogate in string");
  } else if (Array.isArray(value)) {
    value.forEach((item, i) => {
      try {
        checkStrings(item);
      } catch (exc) {
        if (exc instanceof Reject) exc.path.push(String(i));
        throw exc;
      }
    });
  } else if (value !== null && typeof value === "object") {
    for (const key of Object.keys(value)) {
      try {
        if (LONE_SURROGATE.test(key)) throw new Reject("invalid_json", "lone surrogate in object key");
        checkStrings(value[key]!);
      } catch (exc) {
        if (exc instanceof Reject) exc.path.push(segment(key));
        throw exc;
      }
    }
  }
}
