// A fresh process resuming a paused run from its serialized RunState:
//   node agents-resume.mjs STATE_FILE RUN_ID LOG CALL_JSON
// approves the interruptions in the SDK, runs, prints {finalOutput}.
import { readFileSync } from "node:fs";
import { run, RunState } from "@openai/agents";
import { makeAgent } from "./agents-fixture.mjs";

const [stateFile, runId, log, call] = process.argv.slice(2);
const { agent } = makeAgent({ runId, log, call: JSON.parse(call) });
const state = await RunState.fromString(agent, readFileSync(stateFile, "utf8"));
for (const item of state.getInterruptions()) state.approve(item);
const result = await run(agent, state);
console.log(JSON.stringify({ finalOutput: result.finalOutput, interruptions: result.interruptions?.length ?? 0 }));
