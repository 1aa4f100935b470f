// The NATS bridge's security on the wire (inferq/adapters/nats/bridge.hpp): TLS with a
// verified server certificate and client certificates, user/password, token and
// `.creds` (JWT and NKey) credentials, and the server's subject permissions, against
// nats-server processes configured by each test, with certificates and keys the test
// makes with the openssl tool.
#include "inferq/adapters/nats/bridge.hpp"

#include <catch2/catch.hpp>
#include <nats/nats.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <string_view>
#include <thread>

#include "absl/time/clock.h"

#include "nats_test_util.hpp"

using namespace inferq;
using namespace inferq::nats;
using inferq_test::Client;
using inferq_test::NatsServer;
using inferq_test::NewEngine;
using inferq_test::TempDir;
using inferq_test::WaitFor;
namespace fs = std::filesystem;

namespace {

void Write(const fs::path& p, const std::string& text) {
  std::ofstream out(p);
  out << text;
  REQUIRE(out.good());
}

// Runs `command` in `dir` (openssl's output to dir/openssl.log); REQUIREs success.
void Run(const fs::path& dir, const std::string& command) {
  const std::string line = "cd '" + dir.string() + "' && " + command + " >> openssl.log 2>&1";
  INFO(line);
  REQUIRE(std::system(line.c_str()) == 0);
}

// A CA, and certificates it signs for 127.0.0.1 (server), a client, and an expired
// server certificate; and a second CA that signs nothing the server shows.
struct Certificates {
  fs::path dir;
  explicit Certificates(const fs::path& d) : dir(d) {
    fs::create_directories(dir);
    const std::string ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
    Run(dir, "openssl req -x509 " + ec + " -keyout ca-key.pem -out ca.pem -days 2 -subj '/CN=inferq test CA'");
    Run(dir, "openssl req -x509 " + ec + " -keyout other-ca-key.pem -out other-ca.pem -days 2 -subj '/CN=other CA'");
    Write(dir / "server.ext", "subjectAltName=DNS:localhost,IP:127.0.0.1\n");
    Write(dir / "client.ext", "extendedKeyUsage=clientAuth\n");
    Run(dir, "openssl req " + ec + " -keyout server-key.pem -out server.csr -subj '/CN=localhost'");
    Run(dir, "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca-key.pem -CAcreateserial -days 2 "
             "-extfile server.ext -out server.pem");
    Run(dir, "openssl req " + ec + " -keyout client-key.pem -out client.csr -subj '/CN=bridge'");
    Run(dir, "openssl x509 -req -in client.csr -CA ca.pem -CAkey ca-key.pem -CAcreateserial -days 2 "
             "-extfile client.ext -out client.pem");
    // Expired: `openssl ca` sets the validity period (2020-01-01 to 2020-01-02).
    Write(dir / "ca.cnf",
          "[ca]\ndefault_ca = test\n[test]\ndatabase = index.txt\nnew_certs_dir = .\nserial = serial\n"
          "default_md = sha256\npolicy = any\ncopy_extensions = copy\n[any]\ncommonName = supplied\n");
    Write(dir / "index.txt", "");
    Write(dir / "serial", "1000\n");
    Run(dir, "openssl ca -batch -config ca.cnf -cert ca.pem -keyfile ca-key.pem -in server.csr "
             "-startdate 20200101000000Z -enddate 20200102000000Z -extfile server.ext -notext "
             "-out expired.pem");
  }
  std::string operator()(const std::string& name) const { return (dir / name).string(); }
};

std::string TlsConfig(const Certificates& c, const std::string& cert, bool verify_clients) {
  return "tls {\n  cert_file: \"" + c(cert) + "\"\n  key_file: \"" + c("server-key.pem") +
         "\"\n  ca_file: \"" + c("ca.pem") + "\"\n" + (verify_clients ? "  verify: true\n" : "") +
         "  timeout: 2\n}\n";
}


BridgeOptions Tls(const NatsServer& server, const Certificates& c) {
  BridgeOptions o;
  o.connection.servers = {"tls://127.0.0.1:" + std::to_string(server.port())};
  o.connection.tls.enabled = true;
  o.connection.tls.ca_file = c("ca.pem");
  o.connection.tls.cert_file = c("client.pem");
  o.connection.tls.key_file = c("client-key.pem");
  o.connection.max_reconnect = 0;
  o.origin = "site-a";
  return o;
}

std::string Text(const absl::Status& st) { return std::string(st.message()); }

// Options for `server` without TLS or credentials, and without reconnects.
BridgeOptions Plain(const NatsServer& server) {
  BridgeOptions o;
  o.connection.servers = {server.url()};
  o.connection.max_reconnect = 0;
  o.origin = "site-a";
  return o;
}

}  // namespace

TEST_CASE("nats security: TLS with a verified server and a client certificate carries the export") {
  TempDir dir;
  Certificates certs(dir.path() / "certs");
  Write(dir.path() / "server.conf", TlsConfig(certs, "server.pem", /*verify_clients=*/true));
  NatsServer server(dir.path(), {"-c", (dir.path() / "server.conf").string()});
  REQUIRE(server.Start());
  auto engine = NewEngine();
  REQUIRE(engine->AddStream({.name = "LOCAL", .subjects = {"work.>"}}).ok());

  SECTION("the right CA and a client certificate: events flow") {
    auto bridge = NatsBridge::Connect(*engine, Tls(server, certs));
    REQUIRE(bridge.ok());
    natsConnection* nc = nullptr;
    natsSubscription* sub = nullptr;
    natsOptions* o = nullptr;
    REQUIRE(natsOptions_Create(&o) == NATS_OK);
    const std::string url = "tls://127.0.0.1:" + std::to_string(server.port());
    REQUIRE(natsOptions_SetURL(o, url.c_str()) == NATS_OK);
    REQUIRE(natsOptions_SetSecure(o, true) == NATS_OK);
    REQUIRE(natsOptions_LoadCATrustedCertificates(o, certs("ca.pem").c_str()) == NATS_OK);
    REQUIRE(natsOptions_LoadCertificatesChain(o, certs("client.pem").c_str(), certs("client-key.pem").c_str()) ==
            NATS_OK);
    REQUIRE(natsConnection_Connect(&nc, o) == NATS_OK);
    REQUIRE(natsConnection_SubscribeSync(&sub, nc, "tls.>") == NATS_OK);
    REQUIRE(natsConnection_Flush(nc) == NATS_OK);
    REQUIRE((*bridge)->AddExport({.consumer = {.stream = "LOCAL", .name = "out"}, .subject_prefix = "tls",
                                  .jetstream = false})
                .ok());
    Event e;
    e.subject = "work.x";
    e.payload = Buffer::FromString("over tls");
    REQUIRE(engine->Publish(std::move(e)).ok());
    natsMsg* m = nullptr;
    REQUIRE(natsSubscription_NextMsg(&m, sub, 10'000) == NATS_OK);
    CHECK(std::string(natsMsg_GetSubject(m)) == "tls.work.x");
    CHECK(std::string(natsMsg_GetData(m), 8) == "over tls");
    natsMsg_Destroy(m);
    natsSubscription_Destroy(sub);
    natsConnection_Destroy(nc);
    natsOptions_Destroy(o);
  }

  SECTION("a server certificate from another CA is refused") {
    BridgeOptions o = Tls(server, certs);
    o.connection.tls.ca_file = certs("other-ca.pem");
    auto bridge = NatsBridge::Connect(*engine, o);
    REQUIRE_FALSE(bridge.ok());
    CHECK(bridge.status().code() == absl::StatusCode::kUnavailable);
    INFO(Text(bridge.status()));
    CHECK(Text(bridge.status()).rfind("cannot connect to NATS at 'tls://127.0.0.1:", 0) == 0);
    CHECK(Text(bridge.status()).find("SSL handshake error: 20:unable to get local issuer certificate") !=
          std::string::npos);
  }

  SECTION("no client certificate is refused by the server") {
    BridgeOptions o = Tls(server, certs);
    o.connection.tls.cert_file.clear();
    o.connection.tls.key_file.clear();
    auto bridge = NatsBridge::Connect(*engine, o);
    REQUIRE_FALSE(bridge.ok());
    CHECK(bridge.status().code() == absl::StatusCode::kUnavailable);
  }

  SECTION("a CA file that does not exist is named") {
    BridgeOptions o = Tls(server, certs);
    o.connection.tls.ca_file = certs("missing.pem");
    auto bridge = NatsBridge::Connect(*engine, o);
    REQUIRE_FALSE(bridge.ok());
    CHECK(bridge.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(Text(bridge.status()).rfind("NATS connection option tls.ca_file '" + certs("missing.pem") + "': ", 0) == 0);
  }
  const EngineStats s = engine->Stats();
  CHECK(s.components.size() <= 1);
}

TEST_CASE("nats security: an expired server certificate is refused") {
  TempDir dir;
  Certificates certs(dir.path() / "certs");
  Write(dir.path() / "server.conf", TlsConfig(certs, "expired.pem", /*verify_clients=*/false));
  NatsServer server(dir.path(), {"-c", (dir.path() / "server.conf").string()});
  REQUIRE(server.Start());
  auto engine = NewEngine();
  BridgeOptions o = Tls(server, certs);
  auto bridge = NatsBridge::Connect(*engine, o);
  REQUIRE_FALSE(bridge.ok());
  CHECK(bridge.status().code() == absl::StatusCode::kUnavailable);
  INFO(Text(bridge.status()));
  CHECK(Text(bridge.status()).find("SSL handshake error: 10:certificate has expired") != std::string::npos);
}

TEST_CASE("nats security: user and password, token, and subject permissions") {
  TempDir dir;
  Write(dir.path() / "server.conf",
        "authorization {\n"
        "  users = [\n"
        "    {user: bridge, password: s3cret, permissions: {\n"
        "      publish: {allow: [\"allowed.>\", \"$JS.API.>\", \"_INBOX.>\"]}\n"
        "      subscribe: {allow: [\"_INBOX.>\"]}}}\n"
        "    {user: admin, password: root}\n"
        "  ]\n"
        "}\n");
  NatsServer server(dir.path(), {"-c", (dir.path() / "server.conf").string()});
  REQUIRE(server.Start());
  auto engine = NewEngine();
  REQUIRE(engine->AddStream({.name = "LOCAL", .subjects = {"work.>"}}).ok());
  BridgeOptions o = Plain(server);

  SECTION("a wrong password is refused, naming the authorization failure") {
    o.connection.user = "bridge";
    o.connection.password = "wrong";
    auto bridge = NatsBridge::Connect(*engine, o);
    REQUIRE_FALSE(bridge.ok());
    CHECK(bridge.status().code() == absl::StatusCode::kUnavailable);
    INFO(Text(bridge.status()));
    CHECK(Text(bridge.status()).find("Authorization Violation") != std::string::npos);
  }

  SECTION("a publish the server does not permit surfaces as an error and is never acked locally") {
    // The admin makes a JetStream stream on a subject the bridge may not publish to.
    natsOptions* ao = nullptr;
    REQUIRE(natsOptions_Create(&ao) == NATS_OK);
    REQUIRE(natsOptions_SetURL(ao, server.url().c_str()) == NATS_OK);
    REQUIRE(natsOptions_SetUserInfo(ao, "admin", "root") == NATS_OK);
    Client admin(ao);
    natsOptions_Destroy(ao);
    admin.AddStream("DENIED", "denied.>");

    o.connection.user = "bridge";
    o.connection.password = "s3cret";
    auto bridge = NatsBridge::Connect(*engine, o);
    REQUIRE(bridge.ok());
    REQUIRE((*bridge)->AddExport({.consumer = {.stream = "LOCAL", .name = "out"}, .subject_prefix = "denied",
                                  .ack_timeout = absl::Milliseconds(300), .retry_delay = absl::Milliseconds(50)})
                .ok());
    Event e;
    e.subject = "work.x";
    REQUIRE(engine->Publish(std::move(e)).ok());
    REQUIRE(WaitFor([&] { return (*bridge)->Stats().export_failures >= 2; }));
    const BridgeStats s = (*bridge)->Stats();
    CHECK(s.exported == 0);
    INFO(s.last_error);
    // The PubAck never comes; the failure names the server's permission error.
    CHECK(s.last_error.rfind("export of 'work.x' (stream LOCAL sequence 1) to JetStream failed: ", 0) == 0);
    CHECK(s.last_error.find("(the server reported: Permissions Violation for Publish to \"denied.work.x\")") !=
          std::string::npos);
    const EngineStats es = engine->Stats();
    CHECK(es.consumer("LOCAL", "out")->acked == 0);
    jsStreamInfo* info = nullptr;
    REQUIRE(js_GetStreamInfo(&info, admin.js, "DENIED", nullptr, nullptr) == NATS_OK);
    CHECK(info->State.Msgs == 0);
    jsStreamInfo_Destroy(info);
  }
}

TEST_CASE("nats security: a token is checked") {
  TempDir dir;
  Write(dir.path() / "server.conf", "authorization {\n  token: \"t0ken\"\n}\n");
  NatsServer server(dir.path(), {"-c", (dir.path() / "server.conf").string()});
  REQUIRE(server.Start());
  auto engine = NewEngine();
  BridgeOptions o;
  o.connection.servers = {server.url()};
  o.connection.max_reconnect = 0;
  o.origin = "site-a";
  o.connection.token = "wrong";
  auto bad = NatsBridge::Connect(*engine, o);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().code() == absl::StatusCode::kUnavailable);
  CHECK(Text(bad.status()).find("Authorization Violation") != std::string::npos);
  o.connection.token = "t0ken";
  auto good = NatsBridge::Connect(*engine, o);
  REQUIRE(good.ok());
  CHECK((*good)->Stats().connected);
}

// ---- NKeys and JWTs, for `.creds` files ----
//
// The test makes an operator, accounts and users the way `nsc` would, from ed25519
// keys that the openssl tool generates and signs with:
//  - an NKey is base32 (RFC 4648, no padding) of a prefix byte, the 32-byte ed25519
//    public key and a CRC-16/XMODEM of both (little endian); a seed has two prefix
//    bytes (the seed marker and the key's type) before the 32-byte private seed;
//  - a JWT is base64url(header) "." base64url(claims) "." base64url(ed25519 signature
//    of the first two parts by the issuer's key), header {"typ":"JWT","alg":"ed25519-nkey"}.
namespace {

constexpr unsigned char kOperatorPrefix = 14 << 3;  // 'O...'
constexpr unsigned char kAccountPrefix = 0;         // 'A...'
constexpr unsigned char kUserPrefix = 20 << 3;      // 'U...'
constexpr unsigned char kSeedPrefix = 18 << 3;      // 'S...'

std::string ReadBytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  REQUIRE(in.good());
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::uint16_t Crc16(const std::string& bytes) {
  std::uint16_t crc = 0;
  for (unsigned char c : bytes) {
    crc = static_cast<std::uint16_t>(crc ^ (c << 8));
    for (int i = 0; i < 8; ++i) {
      crc = static_cast<std::uint16_t>((crc & 0x8000) != 0 ? (crc << 1) ^ 0x1021 : crc << 1);
    }
  }
  return crc;
}

// `bytes` in an RFC 4648 alphabet of 2^`width` characters, without padding.
std::string Encode(const std::string& bytes, std::string_view alphabet, int width) {
  std::string out;
  unsigned buffer = 0;
  int bits = 0;
  const unsigned mask = (1u << width) - 1;
  for (unsigned char c : bytes) {
    buffer = (buffer << 8) | c;
    bits += 8;
    while (bits >= width) {
      out += alphabet[(buffer >> (bits - width)) & mask];
      bits -= width;
    }
  }
  if (bits > 0) out += alphabet[(buffer << (width - bits)) & mask];
  return out;
}
std::string Base32(const std::string& bytes) { return Encode(bytes, "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", 5); }
std::string Base64Url(const std::string& bytes) {
  return Encode(bytes, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_", 6);
}

std::string WithCrc(std::string bytes) {
  const std::uint16_t crc = Crc16(bytes);
  bytes += static_cast<char>(crc & 0xff);
  bytes += static_cast<char>(crc >> 8);
  return bytes;
}

struct NKey {
  fs::path pem;
  std::string public_key;  // "O...", "A...", "U..."
  std::string seed;        // "SO...", "SA...", "SU..."
};

NKey MakeNKey(const fs::path& dir, const std::string& name, unsigned char prefix) {
  Run(dir, "openssl genpkey -algorithm ed25519 -out " + name + ".pem");
  Run(dir, "openssl pkey -in " + name + ".pem -outform DER -out " + name + ".der");
  Run(dir, "openssl pkey -in " + name + ".pem -pubout -outform DER -out " + name + ".pub.der");
  const std::string priv = ReadBytes(dir / (name + ".der"));
  const std::string pub = ReadBytes(dir / (name + ".pub.der"));
  REQUIRE(priv.size() >= 32);
  REQUIRE(pub.size() >= 32);
  NKey k;
  k.pem = dir / (name + ".pem");
  k.public_key = Base32(WithCrc(std::string(1, static_cast<char>(prefix)) + pub.substr(pub.size() - 32)));
  std::string seed_head;
  seed_head += static_cast<char>(kSeedPrefix | (prefix >> 5));
  seed_head += static_cast<char>((prefix & 31) << 3);
  k.seed = Base32(WithCrc(seed_head + priv.substr(priv.size() - 32)));
  return k;
}

// A JWT with `claims` (a JSON object's members after "iss"), issued and signed by `issuer`.
std::string MakeJwt(const fs::path& dir, const NKey& issuer, const std::string& subject, const std::string& claims,
                    std::int64_t expires_unix_s = 0) {
  static int serial = 0;
  const std::int64_t now = absl::ToUnixSeconds(absl::Now());
  const std::string header = Base64Url(R"({"typ":"JWT","alg":"ed25519-nkey"})");
  const std::string body = Base64Url(
      "{\"jti\":\"inferq-test-" + std::to_string(++serial) + "\",\"iat\":" + std::to_string(now) +
      (expires_unix_s != 0 ? ",\"exp\":" + std::to_string(expires_unix_s) : std::string()) + ",\"iss\":\"" +
      issuer.public_key + "\",\"name\":\"inferq test\",\"sub\":\"" + subject + "\"," + claims + "}");
  const std::string input = header + "." + body;
  Write(dir / "jwt-input", input);
  Run(dir, "openssl pkeyutl -sign -rawin -inkey '" + issuer.pem.string() + "' -in jwt-input -out jwt-signature");
  return input + "." + Base64Url(ReadBytes(dir / "jwt-signature"));
}

// A `.creds` file as nsc writes it: the user's JWT, then its NKey seed.
fs::path WriteCreds(const fs::path& dir, const std::string& name, const std::string& jwt, const std::string& seed) {
  const fs::path p = dir / (name + ".creds");
  Write(p, "-----BEGIN NATS USER JWT-----\n" + jwt + "\n------END NATS USER JWT------\n\n" +
               "-----BEGIN USER NKEY SEED-----\n" + seed + "\n------END USER NKEY SEED------\n");
  return p;
}

const std::string kAccountClaims =
    R"("nats":{"limits":{"subs":-1,"data":-1,"payload":-1,"imports":-1,"exports":-1,"wildcards":true,)"
    R"("conn":-1,"leaf":-1,"mem_storage":-1,"disk_storage":-1,"streams":-1,"consumer":-1},)"
    R"("type":"account","version":2})";
const std::string kUserClaims =
    R"("nats":{"pub":{},"sub":{},"subs":-1,"data":-1,"payload":-1,"type":"user","version":2})";

}  // namespace

TEST_CASE("nats security: a .creds file (user JWT and NKey seed) is checked by an operator-mode server") {
  TempDir dir;
  const fs::path keys = dir.path() / "keys";
  fs::create_directories(keys);
  const NKey op = MakeNKey(keys, "operator", kOperatorPrefix);
  const NKey account = MakeNKey(keys, "account", kAccountPrefix);
  const NKey system = MakeNKey(keys, "system", kAccountPrefix);      // the server's own (JetStream needs it)
  const NKey stranger = MakeNKey(keys, "stranger", kAccountPrefix);  // an account the server does not know
  const NKey user = MakeNKey(keys, "user", kUserPrefix);
  const NKey other_user = MakeNKey(keys, "other-user", kUserPrefix);
  REQUIRE(op.public_key[0] == 'O');
  REQUIRE(account.public_key[0] == 'A');
  REQUIRE(user.public_key[0] == 'U');
  REQUIRE(user.seed.rfind("SU", 0) == 0);
  Write(dir.path() / "operator.jwt",
        MakeJwt(keys, op, op.public_key, R"("nats":{"type":"operator","version":2})"));
  // The account's JWT is issued by the operator; the account issues its users'.
  const std::string trusted_account_jwt = MakeJwt(keys, op, account.public_key, kAccountClaims);
  const std::string system_jwt =
      MakeJwt(keys, op, system.public_key, R"("nats":{"limits":{"subs":-1,"data":-1,"payload":-1,"conn":-1},)"
                                           R"("type":"account","version":2})");
  Write(dir.path() / "server.conf",
        "operator: \"" + (dir.path() / "operator.jwt").string() + "\"\nsystem_account: " + system.public_key +
            "\nresolver: MEMORY\nresolver_preload: {\n  " + account.public_key + ": \"" + trusted_account_jwt +
            "\"\n  " + system.public_key + ": \"" + system_jwt + "\"\n}\n");
  NatsServer server(dir.path(), {"-c", (dir.path() / "server.conf").string()});
  if (!server.Start()) FAIL("nats-server did not start:\n" << server.Log());
  auto engine = NewEngine();
  REQUIRE(engine->AddStream({.name = "LOCAL", .subjects = {"work.>"}}).ok());
  BridgeOptions o = Plain(server);

  SECTION("the user of a trusted account connects, and its export reaches JetStream") {
    const fs::path creds = WriteCreds(dir.path(), "user", MakeJwt(keys, account, user.public_key, kUserClaims),
                                      user.seed);
    // The stream, made over a plain nats.c connection with the same credentials.
    natsOptions* no = nullptr;
    REQUIRE(natsOptions_Create(&no) == NATS_OK);
    REQUIRE(natsOptions_SetURL(no, server.url().c_str()) == NATS_OK);
    REQUIRE(natsOptions_SetUserCredentialsFromFiles(no, creds.c_str(), nullptr) == NATS_OK);
    Client client(no);
    natsOptions_Destroy(no);
    client.AddStream("REMOTE", "site-a.>");

    o.connection.credentials_file = creds.string();
    auto bridge = NatsBridge::Connect(*engine, o);
    REQUIRE(bridge.ok());
    REQUIRE((*bridge)->AddExport({.consumer = {.stream = "LOCAL", .name = "out"}, .subject_prefix = "site-a"}).ok());
    Event e;
    e.subject = "work.x";
    REQUIRE(engine->Publish(std::move(e)).ok());
    REQUIRE(WaitFor([&] { return (*bridge)->Stats().exported == 1; }));
    CHECK(client.Messages("REMOTE") == 1);
  }

  // Each refusal: Unavailable naming the server's verdict, and no connection.
  auto refused = [&](const fs::path& creds) {
    o.connection.credentials_file = creds.string();
    auto bridge = NatsBridge::Connect(*engine, o);
    REQUIRE_FALSE(bridge.ok());
    CHECK(bridge.status().code() == absl::StatusCode::kUnavailable);
    INFO(Text(bridge.status()));
    CHECK(Text(bridge.status()).find("Authorization Violation") != std::string::npos);
    const EngineStats es = engine->Stats();
    CHECK(es.component("nats_bridge.site-a") == nullptr);
  };
  SECTION("a user of an account the operator did not sign is refused") {
    refused(WriteCreds(dir.path(), "stranger", MakeJwt(keys, stranger, user.public_key, kUserClaims), user.seed));
  }
  SECTION("an expired user JWT is refused") {
    const std::int64_t an_hour_ago = absl::ToUnixSeconds(absl::Now()) - 3600;
    refused(WriteCreds(dir.path(), "expired", MakeJwt(keys, account, user.public_key, kUserClaims, an_hour_ago),
                       user.seed));
  }
  SECTION("a seed that is not the JWT's user is refused") {
    refused(WriteCreds(dir.path(), "mismatch", MakeJwt(keys, account, user.public_key, kUserClaims),
                       other_user.seed));
  }
  SECTION("a credentials file that cannot be read is named") {
    o.connection.credentials_file = (dir.path() / "missing.creds").string();
    auto bridge = NatsBridge::Connect(*engine, o);
    REQUIRE_FALSE(bridge.ok());
    INFO(Text(bridge.status()));
    CHECK(bridge.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(Text(bridge.status()) == "NATS connection option credentials_file '" +
                                       (dir.path() / "missing.creds").string() +
                                       "': cannot be read: No such file or directory");
  }
}
