// A real convlog serve for the tests: the binary the Go test built
// (CONVLOG_BIN), on a loopback port kept across restarts, with its own data
// folder; and a real stream reset and rewind (CONVLOG_LOGTOOL) done while it is down.
import { spawn, execFile } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createServer } from "node:net";
import { promisify } from "node:util";

const bin = process.env.CONVLOG_BIN;
const logtool = process.env.CONVLOG_LOGTOOL;
export const haveServer = Boolean(bin);

function freePort() {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

export class Serve {
  static async start(args = []) {
    const s = new Serve();
    s.args = args;
    s.port = await freePort();
    s.data = mkdtempSync(join(tmpdir(), "convlog-js-"));
    s.base = `http://127.0.0.1:${s.port}`;
    await s.up();
    return s;
  }

  async up() {
    this.stderr = "";
    this.proc = spawn(bin, ["serve", "--listen", `127.0.0.1:${this.port}`, "--data", this.data, ...this.args], {
      stdio: ["ignore", "ignore", "pipe"],
    });
    this.proc.stderr.on("data", (d) => (this.stderr += d));
    this.exited = new Promise((resolve) => this.proc.once("exit", (code, signal) => resolve({ code, signal })));
    // Poll readiness: the port answers only once the service is up.
    for (;;) {
      const exit = await Promise.race([this.exited, new Promise((r) => setTimeout(r, 50, null))]);
      if (exit) throw new Error(`convlog serve exited (${JSON.stringify(exit)}):\n${this.stderr}`);
      try {
        const res = await fetch(`${this.base}/readyz`);
        if (res.ok) return;
      } catch {
        // not listening yet
      }
    }
  }

  async down(signal = "SIGKILL") {
    if (!this.proc || this.proc.exitCode !== null || this.proc.signalCode !== null) return;
    this.proc.kill(signal);
    await this.exited;
  }

  async restart(signal = "SIGKILL") {
    await this.down(signal);
    await this.up();
  }

  /** Resets a stream's incarnation (log.DB.Reset) with the service stopped, then starts it again. */
  async resetStream(agent, instance, session = "default") {
    return this.offline("reset", agent, instance, session);
  }

  /** Appends a truncated record (rewoundTo entryId), the service stopped meanwhile. */
  async rewind(agent, instance, session, entryId) {
    return this.offline("rewind", agent, instance, session, entryId);
  }

  async offline(...args) {
    await this.down("SIGTERM");
    const { stdout } = await promisify(execFile)(logtool, [args[0], this.data, ...args.slice(1)]);
    await this.up();
    return stdout.trim();
  }

  async stop() {
    await this.down("SIGTERM");
    rmSync(this.data, { recursive: true, force: true });
  }
}

/** Polls cond until it holds (the tests never sleep and hope). */
export async function eventually(cond) {
  for (;;) {
    const v = await cond();
    if (v) return v;
    await new Promise((r) => setTimeout(r, 20));
  }
}
