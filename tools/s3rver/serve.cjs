// The loopback S3 server: npm s3rver (objects in files under DATA_DIR, a ranged GET reads only its range)
// on 127.0.0.1:PORT, with one JSON line per request appended to REQUESTS (method, path, status, bytes sent).
//
//     node tools/s3rver/serve.cjs PORT DATA_DIR REQUESTS
//
// Started by components/local/s3_server.py (the tests, `make local S3=1`, bench/coldstart). DATA_DIR is the
// server's own: emptied at start and removed at exit, so every start is an empty store, as moto's was.
'use strict';

const fs = require('fs');
const S3rver = require('s3rver');
const AWSAccount = require('s3rver/lib/models/account');

const HOST = '127.0.0.1';
// The loopback credentials of components/local/s3_server.py (LOOPBACK_CREDENTIALS); nothing else sees them.
const ACCESS_KEY = 'inferstack-local';

const [port, directory, requests] = process.argv.slice(2);
if (!port || !directory || !requests) {
  process.stderr.write('usage: node serve.cjs PORT DATA_DIR REQUESTS\n');
  process.exit(2);
}

function removeData() {
  fs.rmSync(directory, { recursive: true, force: true });
}

removeData();
fs.mkdirSync(directory, { recursive: true });
AWSAccount.DUMMY_ACCOUNT.createKeyPair(ACCESS_KEY, ACCESS_KEY);

const server = new S3rver({
  address: HOST,
  port: Number(port),
  directory,
  silent: true,
  vhostBuckets: false, // path-style only: every logged path starts with its bucket
});

// First in the chain: counts what the response wrote, whatever produced it (a file stream, XML, an error).
server.middleware.unshift(async (ctx, next) => {
  const { res } = ctx;
  let sent = 0;
  const count = chunk => {
    if (chunk && typeof chunk !== 'function') sent += Buffer.byteLength(chunk);
  };
  const write = res.write;
  const end = res.end;
  res.write = function (chunk, ...rest) {
    count(chunk);
    return write.call(this, chunk, ...rest);
  };
  res.end = function (chunk, ...rest) {
    count(chunk);
    return end.call(this, chunk, ...rest);
  };
  res.once('close', () => {
    let path = ctx.path;
    try {
      path = decodeURIComponent(path); // as a WSGI PATH_INFO reads
    } catch (err) {
      // a malformed escape: log the path as it came
    }
    const line = {
      method: ctx.method,
      path,
      status: res.statusCode,
      bytes: ctx.method === 'HEAD' ? 0 : sent, // Node sends no body for a HEAD
    };
    fs.appendFileSync(requests, JSON.stringify(line) + '\n');
  });
  await next();
});

function stop(code) {
  removeData();
  process.exit(code);
}

process.on('SIGTERM', () => stop(0));
process.on('SIGINT', () => stop(0));
process.on('uncaughtException', err => {
  process.stderr.write(`loopback S3 server: ${err.stack || err}\n`);
  stop(1);
});

server.run().then(
  address => process.stdout.write(`loopback S3 (s3rver) listening on http://${address.address}:${address.port}\n`),
  err => {
    process.stderr.write(`loopback S3 server could not start: ${err.message}\n`);
    stop(1);
  },
);
