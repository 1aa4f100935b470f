// A tiny program that uses inferq the way an outside project does: through the
// umbrella header and the exported target. Exits 0 only when one event makes the
// whole trip publish -> consumer member -> ack, a routing predicate matches, and the
// schema registry refuses an incompatible schema.
#include <cstdio>
#include <string>

#include "inferq/inferq.hpp"
#ifdef CONSUMER_PROMETHEUS
#include "inferq/adapters/prometheus/engine_collector.hpp"
#include "inferq/adapters/prometheus/metrics_server.hpp"
#endif
#ifdef CONSUMER_OTLP
#include "inferq/adapters/otlp/otlp_exporter.hpp"
#endif

int main() {
  absl::StatusOr<std::unique_ptr<inferq::Engine>> created = inferq::Engine::Create();
  if (!created.ok()) return 4;
  inferq::Engine& engine = **created;
  if (!engine.AddStream({.name = "S", .subjects = {"hello.>"}}).ok()) return 1;
  auto consumer = engine.AddConsumer({.stream = "S", .name = "c"});
  if (!consumer.ok()) return 2;
  inferq::Event e;
  e.subject = "hello.world";
  e.payload = inferq::Buffer::FromString("payload");
  if (!engine.Publish(std::move(e)).ok()) return 3;
  auto m = consumer->member(0)->Next(absl::Seconds(5));
  if (!m.ok() || m->event().payload.view() != "payload") return 4;
  if (!m->Ack().ok()) return 5;
  // A routing predicate: links the code that uses RE2, RapidJSON and valijson, which a
  // consumer gets through inferq's package (RE2) or not at all (header-only, private).
  auto p = inferq::Predicate::Json("/model", inferq::JsonOp::kMatches, R"("^llama")");
  if (!p.ok()) return 6;
  inferq::Event j;
  j.payload = inferq::Buffer::FromString(R"({"model": "llama-3"})");
  if (!p->Matches(j)) return 7;
  // The schema registry: links FlatBuffers' parser, which inferq links privately (a
  // static libinferq passes it on through its package, as it does RE2).
  inferq::SchemaRegistry registry;
  if (!registry.Register("hello.world", "table T { a:int; }\nroot_type T;\n").ok()) return 8;
  if (registry.Register("hello.world", "table T { a:long; }\nroot_type T;\n").status().code() !=
      absl::StatusCode::kFailedPrecondition) {
    return 9;
  }
  // JSON Schema predicates, built in or not (INFERQ_WITH_JSON_SCHEMA).
  auto schema = inferq::Predicate::JsonSchema(R"({"type": "object", "required": ["model"]})");
#if CONSUMER_EXPECTS_JSON_SCHEMA
  if (!schema.ok() || !schema->Matches(j)) return 10;
#else
  if (schema.status().code() != absl::StatusCode::kUnimplemented ||
      std::string(schema.status().message()).find("INFERQ_WITH_JSON_SCHEMA=OFF") == std::string::npos) {
    std::fprintf(stderr, "JsonSchema without INFERQ_WITH_JSON_SCHEMA: %s\n",
                 schema.status().ToString().c_str());
    return 11;
  }
#endif
#ifdef CONSUMER_PROMETHEUS
  // inferq::prometheus from the installed package: the one publish above, exposed.
  const std::string text = inferq::prometheus::ExpositionText(inferq::prometheus::EngineCollector(engine));
  if (text.find("\ninferq_published_total 1\n") == std::string::npos) return 12;
#endif
#ifdef CONSUMER_OTLP
  // inferq::otlp from the installed package (links libcurl): a span encoded.
  inferq::Span span;
  span.destination = "hello.world";
  const std::string json = inferq::otlp::OtlpHttpExporter::EncodeJson({&span, 1}, "consumer");
  if (json.find("\"publish hello.world\"") == std::string::npos) return 13;
#endif
  std::printf("inferq %s consumer ok (JSON Schema predicates %s)\n", INFERQ_VERSION_STRING,
              CONSUMER_EXPECTS_JSON_SCHEMA ? "built in" : "off");
  return 0;
}
