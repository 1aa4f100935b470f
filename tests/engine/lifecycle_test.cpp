// Tests of Lifecycle (inferq/engine/lifecycle.hpp): exact state sequences and store
// values, every refused transition with its error text, timeouts on a ManualClock,
// eviction in one transaction, reopen, failed commits, a threaded stress run with
// Verify, and a crash test that SIGKILLs a child driving random transitions.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "../state/state_test_util.hpp"
#include "inferq/engine/engine.hpp"
#include "inferq/engine/lifecycle.hpp"
#include "inferq/state/state_store.hpp"

extern char** environ;

namespace {

using inferq::Lifecycle;
using inferq::MessageState;
using inferq::ModelState;
using inferq::StateStore;

constexpr std::int64_t kSec = 1'000'000'000;

struct Env {
  state_test::TempDir dir;
  inferq::ManualClock clock{0};
  std::shared_ptr<state_test::FaultyFileSystem> fs;
  std::unique_ptr<StateStore> store;
  std::unique_ptr<Lifecycle> lc;
  inferq::LifecycleOptions lo;

  explicit Env(bool faulty = false) {
    if (faulty) fs = std::make_shared<state_test::FaultyFileSystem>();
    lo.clock = &clock;
    Reopen();
  }
  void Reopen() {
    lc.reset();
    store.reset();
    auto o = state_test::Options(dir.path());
    o.file_system = fs;
    auto s = StateStore::Open(o);
    REQUIRE(s.ok());
    store = std::move(*s);
    auto l = Lifecycle::Open(store.get(), lo);
    INFO(l.status().ToString());
    REQUIRE(l.ok());
    lc = std::move(*l);
  }
  std::string Raw(const std::string& key) { return store->Get(key).value_or("<absent>"); }
};

std::string Err(const absl::Status& st) { return st.ToString(); }

}  // namespace

TEST_CASE("happy path: exact states, times and store values") {
  Env e;
  REQUIRE(e.lc->BeginWarmup("llama").ok());
  auto m = e.lc->GetModel("llama");
  REQUIRE(m.ok());
  CHECK(m->state == ModelState::kWarmup);
  CHECK(m->since_ns == 0);
  CHECK(m->generation == 1);
  CHECK(m->reason.empty());
  CHECK(e.Raw("lifecycle.model.llama") == "v1 warmup 0 1 ");

  e.clock.Advance(absl::Seconds(1));
  REQUIRE(e.lc->Enqueue("r1", "llama").ok());  // Pending while the model warms up
  auto g = e.lc->GetMessage("r1");
  REQUIRE(g.ok());
  CHECK(g->state == MessageState::kPending);
  CHECK(g->model == "llama");
  CHECK(g->enqueued_ns == 1 * kSec);
  CHECK(g->since_ns == 1 * kSec);
  CHECK(e.Raw("lifecycle.msg.r1") == "v1 pending llama 1000000000 1000000000 ");
  CHECK(e.lc->GetModel("llama")->live_messages == 1);

  e.clock.Advance(absl::Seconds(2));
  REQUIRE(e.lc->ModelReady("llama").ok());
  CHECK(e.lc->GetModel("llama")->state == ModelState::kInference);
  CHECK(e.lc->GetModel("llama")->since_ns == 3 * kSec);
  CHECK(e.Raw("lifecycle.model.llama") == "v1 inference 3000000000 1 ");

  REQUIRE(e.lc->StartProcessing("r1").ok());
  CHECK(e.lc->GetMessage("r1")->state == MessageState::kProcessing);
  CHECK(e.Raw("lifecycle.msg.r1") == "v1 processing llama 1000000000 3000000000 ");

  e.clock.Advance(absl::Seconds(1));
  REQUIRE(e.lc->Complete("r1").ok());
  CHECK(e.lc->GetMessage("r1")->state == MessageState::kCompleted);
  CHECK(e.lc->GetMessage("r1")->since_ns == 4 * kSec);
  CHECK(e.Raw("lifecycle.msg.r1") == "v1 completed llama 1000000000 4000000000 ");
  CHECK(e.lc->GetModel("llama")->live_messages == 0);

  REQUIRE(e.lc->Forget("r1").ok());
  CHECK(Err(e.lc->GetMessage("r1").status()) == "NOT_FOUND: message 'r1' is unknown");
  CHECK(e.Raw("lifecycle.msg.r1") == "<absent>");

  auto ev = e.lc->Evict("llama", "idle");
  REQUIRE(ev.ok());
  CHECK(ev->empty());
  CHECK(e.Raw("lifecycle.model.llama") == "v1 evicted 4000000000 1 idle");
  CHECK(e.lc->GetModel("llama")->reason == "idle");

  REQUIRE(e.lc->BeginWarmup("llama").ok());  // a second life
  CHECK(e.lc->GetModel("llama")->generation == 2);
  CHECK(e.lc->GetModel("llama")->reason.empty());
  CHECK(e.Raw("lifecycle.model.llama") == "v1 warmup 4000000000 2 ");
  // The id is free again after Forget.
  REQUIRE(e.lc->Enqueue("r1", "llama").ok());

  CHECK(e.store->last_tx_id() == 9);
  const inferq::LifecycleStats s = e.lc->Stats();
  CHECK(s.models_warmup == 1);
  CHECK(s.models_inference == 0);
  CHECK(s.models_evicted == 0);
  CHECK(s.messages_pending == 1);
  CHECK(s.messages_processing == 0);
  CHECK(s.messages_completed == 0);
  CHECK(s.messages_expired == 0);
  CHECK(s.transactions == 9);
  CHECK(s.transitions == 8);
  CHECK(s.forgotten == 1);
  CHECK(s.failed_commits == 0);
  CHECK(s.evictions_by_reason == std::map<std::string, std::uint64_t>{{"idle", 1}});
  CHECK(s.expirations_by_reason.empty());
  CHECK(e.lc->Verify().ok());
}

TEST_CASE("refused transitions name the record and its state and change nothing") {
  Env e;
  REQUIRE(e.lc->BeginWarmup("a").ok());  // stays in warmup
  REQUIRE(e.lc->BeginWarmup("b").ok());
  REQUIRE(e.lc->ModelReady("b").ok());
  REQUIRE(e.lc->BeginWarmup("c").ok());
  REQUIRE(e.lc->Evict("c", "oom").ok());
  REQUIRE(e.lc->Enqueue("p", "b").ok());  // pending
  REQUIRE(e.lc->Enqueue("q", "b").ok());
  REQUIRE(e.lc->StartProcessing("q").ok());  // processing
  REQUIRE(e.lc->Enqueue("d", "b").ok());
  REQUIRE(e.lc->StartProcessing("d").ok());
  REQUIRE(e.lc->Complete("d").ok());  // completed
  REQUIRE(e.lc->Enqueue("x", "b").ok());
  REQUIRE(e.lc->Expire("x", "client gone").ok());  // expired
  REQUIRE(e.lc->Enqueue("w", "a").ok());  // pending on a warming model
  const std::uint64_t tx = e.store->last_tx_id();
  const inferq::LifecycleStats before = e.lc->Stats();
  const std::string bad_name = " must be 1 to 256 visible ASCII characters (0x21 to 0x7e)";
  const std::string bad_reason = " must be 1 to 256 printable ASCII characters (0x20 to 0x7e)";

  const std::vector<std::pair<absl::Status, std::string>> cases = {
      {e.lc->BeginWarmup("a"),
       "FAILED_PRECONDITION: model 'a' is in warmup; BeginWarmup needs it new or evicted"},
      {e.lc->BeginWarmup("b"),
       "FAILED_PRECONDITION: model 'b' is in inference; BeginWarmup needs it new or evicted"},
      {e.lc->BeginWarmup(""), "INVALID_ARGUMENT: model ''" + bad_name},
      {e.lc->BeginWarmup("a b"), "INVALID_ARGUMENT: model 'a b'" + bad_name},
      {e.lc->BeginWarmup(std::string(257, 'm')),
       "INVALID_ARGUMENT: model '" + std::string(257, 'm') + "'" + bad_name},
      {e.lc->ModelReady("b"), "FAILED_PRECONDITION: model 'b' is in inference; ModelReady needs warmup"},
      {e.lc->ModelReady("c"), "FAILED_PRECONDITION: model 'c' is evicted; ModelReady needs warmup"},
      {e.lc->ModelReady("zz"), "NOT_FOUND: model 'zz' is unknown"},
      {e.lc->Evict("c", "x").status(),
       "FAILED_PRECONDITION: model 'c' is evicted; Evict needs warmup or inference"},
      {e.lc->Evict("b", "").status(), "INVALID_ARGUMENT: reason ''" + bad_reason},
      {e.lc->Evict("b", "a\nb").status(), "INVALID_ARGUMENT: reason 'a\\x0ab'" + bad_reason},
      {e.lc->Evict("zz", "x").status(), "NOT_FOUND: model 'zz' is unknown"},
      {e.lc->Enqueue("p", "b"),
       "ALREADY_EXISTS: message 'p' is pending on model 'b'; Enqueue needs a new msg_id"},
      {e.lc->Enqueue("d", "a"),
       "ALREADY_EXISTS: message 'd' is completed on model 'b'; Enqueue needs a new msg_id"},
      {e.lc->Enqueue("n1", "c"),
       "FAILED_PRECONDITION: model 'c' is evicted; Enqueue needs it in warmup or inference"},
      {e.lc->Enqueue("n1", "zz"), "NOT_FOUND: model 'zz' is unknown"},
      {e.lc->Enqueue(std::string("n\x01", 2), "b"), "INVALID_ARGUMENT: msg_id 'n\\x01'" + bad_name},
      {e.lc->Enqueue("n1", ""), "INVALID_ARGUMENT: model ''" + bad_name},
      {e.lc->StartProcessing("q"),
       "FAILED_PRECONDITION: message 'q' is processing; StartProcessing needs pending"},
      {e.lc->StartProcessing("w"),
       "FAILED_PRECONDITION: model 'a' is in warmup; StartProcessing of message 'w' needs it "
       "in inference"},
      {e.lc->StartProcessing("nope"), "NOT_FOUND: message 'nope' is unknown"},
      {e.lc->StartProcessing(""), "INVALID_ARGUMENT: msg_id ''" + bad_name},
      {e.lc->Complete("p"), "FAILED_PRECONDITION: message 'p' is pending; Complete needs processing"},
      {e.lc->Complete("d"), "FAILED_PRECONDITION: message 'd' is completed; Complete needs processing"},
      {e.lc->Complete("x"), "FAILED_PRECONDITION: message 'x' is expired; Complete needs processing"},
      {e.lc->Complete("nope"), "NOT_FOUND: message 'nope' is unknown"},
      {e.lc->Requeue("p"), "FAILED_PRECONDITION: message 'p' is pending; Requeue needs processing"},
      {e.lc->Requeue("d"), "FAILED_PRECONDITION: message 'd' is completed; Requeue needs processing"},
      {e.lc->Requeue("nope"), "NOT_FOUND: message 'nope' is unknown"},
      {e.lc->Expire("d", "late"),
       "FAILED_PRECONDITION: message 'd' is completed; Expire needs pending or processing"},
      {e.lc->Expire("x", "late"),
       "FAILED_PRECONDITION: message 'x' is expired; Expire needs pending or processing"},
      {e.lc->Expire("p", std::string(257, 'r')),
       "INVALID_ARGUMENT: reason '" + std::string(257, 'r') + "'" + bad_reason},
      {e.lc->Expire("nope", "late"), "NOT_FOUND: message 'nope' is unknown"},
      {e.lc->Forget("p"), "FAILED_PRECONDITION: message 'p' is pending; Forget needs completed or expired"},
      {e.lc->Forget("q"),
       "FAILED_PRECONDITION: message 'q' is processing; Forget needs completed or expired"},
      {e.lc->Forget("nope"), "NOT_FOUND: message 'nope' is unknown"},
      {e.lc->GetModel("zz").status(), "NOT_FOUND: model 'zz' is unknown"},
  };
  for (const auto& [st, want] : cases) CHECK(Err(st) == want);

  CHECK(e.store->last_tx_id() == tx);  // nothing committed
  const inferq::LifecycleStats after = e.lc->Stats();
  CHECK(after.transactions == before.transactions);
  CHECK(after.messages_pending == 2);
  CHECK(after.messages_processing == 1);
  CHECK(after.messages_completed == 1);
  CHECK(after.messages_expired == 1);
  CHECK(after.models_warmup == 1);
  CHECK(after.models_inference == 1);
  CHECK(after.models_evicted == 1);
  CHECK(e.lc->GetMessage("p")->state == MessageState::kPending);
  CHECK(e.lc->GetMessage("q")->state == MessageState::kProcessing);
  CHECK(e.lc->GetMessage("x")->reason == "client gone");
  CHECK(e.lc->Verify().ok());
}

TEST_CASE("warmup timeout: not at 30 s - 1 ns, at 30 s, with the model's messages in one tx") {
  Env e;
  REQUIRE(e.lc->BeginWarmup("m").ok());
  REQUIRE(e.lc->Enqueue("x", "m").ok());
  REQUIRE(e.lc->Enqueue("y", "m").ok());
  REQUIRE(e.lc->BeginWarmup("other").ok());
  REQUIRE(e.lc->ModelReady("other").ok());  // Inference never times out
  const std::uint64_t tx = e.store->last_tx_id();

  e.clock.Advance(absl::Seconds(30) - absl::Nanoseconds(1));
  auto r = e.lc->RunTimeouts();
  REQUIRE(r.ok());
  CHECK(r->evicted_models.empty());
  CHECK(r->expired_messages.empty());
  CHECK(e.store->last_tx_id() == tx);
  CHECK(e.lc->GetModel("m")->state == ModelState::kWarmup);

  e.clock.Advance(absl::Nanoseconds(1));
  r = e.lc->RunTimeouts();
  REQUIRE(r.ok());
  CHECK(r->evicted_models == std::vector<std::string>{"m"});
  CHECK(r->expired_messages == std::vector<std::string>{"x", "y"});
  CHECK(e.store->last_tx_id() == tx + 1);
  CHECK(e.Raw("lifecycle.model.m") == "v1 evicted 30000000000 1 warmup timeout");
  CHECK(e.Raw("lifecycle.msg.x") == "v1 expired m 0 30000000000 model evicted");
  CHECK(e.Raw("lifecycle.msg.y") == "v1 expired m 0 30000000000 model evicted");
  CHECK(e.lc->GetModel("other")->state == ModelState::kInference);
  const auto s = e.lc->Stats();
  CHECK(s.evictions_by_reason == std::map<std::string, std::uint64_t>{{"warmup timeout", 1}});
  CHECK(s.expirations_by_reason == std::map<std::string, std::uint64_t>{{"model evicted", 2}});

  r = e.lc->RunTimeouts();  // nothing left to do
  REQUIRE(r.ok());
  CHECK(r->evicted_models.empty());
  CHECK(e.store->last_tx_id() == tx + 1);
  CHECK(e.lc->Verify().ok());
}

TEST_CASE("inference timeout: a message Processing for 120 s expires, Pending ones stay") {
  Env e;
  REQUIRE(e.lc->BeginWarmup("m").ok());
  REQUIRE(e.lc->ModelReady("m").ok());
  REQUIRE(e.lc->Enqueue("run", "m").ok());
  REQUIRE(e.lc->Enqueue("wait", "m").ok());
  e.clock.Advance(absl::Seconds(5));
  REQUIRE(e.lc->StartProcessing("run").ok());  // since 5 s
  const std::uint64_t tx = e.store->last_tx_id();

  e.clock.Advance(absl::Seconds(120) - absl::Nanoseconds(1));
  auto r = e.lc->RunTimeouts();
  REQUIRE(r.ok());
  CHECK(r->expired_messages.empty());
  CHECK(e.store->last_tx_id() == tx);

  e.clock.Advance(absl::Nanoseconds(1));
  r = e.lc->RunTimeouts();
  REQUIRE(r.ok());
  CHECK(r->evicted_models.empty());
  CHECK(r->expired_messages == std::vector<std::string>{"run"});
  CHECK(e.store->last_tx_id() == tx + 1);
  auto g = e.lc->GetMessage("run");
  CHECK(g->state == MessageState::kExpired);
  CHECK(g->reason == "inference timeout");
  CHECK(g->since_ns == 125 * kSec);
  CHECK(e.lc->GetMessage("wait")->state == MessageState::kPending);
  CHECK(e.lc->GetModel("m")->state == ModelState::kInference);
  CHECK(e.lc->Stats().expirations_by_reason ==
        std::map<std::string, std::uint64_t>{{"inference timeout", 1}});
}

TEST_CASE("timeouts follow the options; infinite turns them off; bad options are refused") {
  SECTION("custom and infinite") {
    Env e;
    e.lo.warmup_timeout = absl::InfiniteDuration();
    e.lo.inference_timeout = absl::Milliseconds(250);
    e.Reopen();
    REQUIRE(e.lc->BeginWarmup("slow").ok());
    REQUIRE(e.lc->BeginWarmup("m").ok());
    REQUIRE(e.lc->ModelReady("m").ok());
    REQUIRE(e.lc->Enqueue("x", "m").ok());
    REQUIRE(e.lc->StartProcessing("x").ok());
    e.clock.Advance(absl::Hours(10000));
    auto r = e.lc->RunTimeouts();
    REQUIRE(r.ok());
    CHECK(r->evicted_models.empty());
    CHECK(r->expired_messages == std::vector<std::string>{"x"});
    CHECK(e.lc->GetModel("slow")->state == ModelState::kWarmup);
  }
  SECTION("refused") {
    state_test::TempDir d;
    auto s = StateStore::Open(state_test::Options(d.path()));
    REQUIRE(s.ok());
    inferq::LifecycleOptions o;
    o.warmup_timeout = absl::ZeroDuration();
    CHECK(Err(Lifecycle::Open(s->get(), o).status()) ==
          "INVALID_ARGUMENT: LifecycleOptions.warmup_timeout 0 must be > 0");
    o = {};
    o.inference_timeout = absl::Seconds(-1);
    CHECK(Err(Lifecycle::Open(s->get(), o).status()) ==
          "INVALID_ARGUMENT: LifecycleOptions.inference_timeout -1s must be > 0");
    o = {};
    o.key_prefix = "life..cycle";
    CHECK(Err(Lifecycle::Open(s->get(), o).status()) ==
          "INVALID_ARGUMENT: LifecycleOptions.key_prefix 'life..cycle' must be 1 to 64 "
          "characters of A-Z a-z 0-9 _ - . (no '.' first, last or doubled)");
    o = {};
    CHECK(Err(Lifecycle::Open(nullptr, o).status()) ==
          "INVALID_ARGUMENT: Lifecycle::Open: store is null");
    o.key_prefix = "svc.lc";  // a custom prefix lands in the keys
    auto lc = Lifecycle::Open(s->get(), o);
    REQUIRE(lc.ok());
    REQUIRE((*lc)->BeginWarmup("m").ok());
    CHECK((*s)->Get("svc.lc.model.m").has_value());
  }
}

TEST_CASE("eviction expires the model's live messages in exactly one transaction") {
  Env e;
  REQUIRE(e.lc->BeginWarmup("m").ok());
  REQUIRE(e.lc->ModelReady("m").ok());
  REQUIRE(e.lc->BeginWarmup("n").ok());
  for (const char* id : {"a3", "a1", "a2", "done"}) REQUIRE(e.lc->Enqueue(id, "m").ok());
  REQUIRE(e.lc->Enqueue("elsewhere", "n").ok());
  REQUIRE(e.lc->StartProcessing("a2").ok());
  REQUIRE(e.lc->StartProcessing("done").ok());
  REQUIRE(e.lc->Complete("done").ok());
  e.clock.Advance(absl::Seconds(7));
  const std::uint64_t tx = e.store->last_tx_id();
  auto r = e.lc->Evict("m", "replica lost");
  REQUIRE(r.ok());
  CHECK(*r == std::vector<std::string>{"a1", "a2", "a3"});
  CHECK(e.store->last_tx_id() == tx + 1);
  CHECK(e.Raw("lifecycle.model.m") == "v1 evicted 7000000000 1 replica lost");
  CHECK(e.Raw("lifecycle.msg.a2") == "v1 expired m 0 7000000000 model evicted");
  CHECK(e.Raw("lifecycle.msg.done") == "v1 completed m 0 0 ");
  CHECK(e.lc->GetMessage("elsewhere")->state == MessageState::kPending);
  CHECK(e.lc->GetModel("m")->live_messages == 0);
  const auto s = e.lc->Stats();
  CHECK(s.transitions == e.store->last_tx_id() + 3);  // the Evict counts 4, in one tx
  CHECK(s.expirations_by_reason == std::map<std::string, std::uint64_t>{{"model evicted", 3}});
  CHECK(e.lc->Verify().ok());
}

TEST_CASE("reopen: the states are what was committed") {
  Env e;
  REQUIRE(e.lc->BeginWarmup("w").ok());
  REQUIRE(e.lc->BeginWarmup("i").ok());
  REQUIRE(e.lc->ModelReady("i").ok());
  REQUIRE(e.lc->BeginWarmup("gone").ok());
  REQUIRE(e.lc->Enqueue("p1", "gone").ok());
  REQUIRE(e.lc->Evict("gone", "drained").ok());
  REQUIRE(e.lc->Enqueue("p", "w").ok());
  REQUIRE(e.lc->Enqueue("r", "i").ok());
  e.clock.Advance(absl::Seconds(10));
  REQUIRE(e.lc->StartProcessing("r").ok());
  REQUIRE(e.lc->Enqueue("c", "i").ok());
  REQUIRE(e.lc->StartProcessing("c").ok());
  REQUIRE(e.lc->Complete("c").ok());
  const std::uint64_t tx = e.store->last_tx_id();

  e.Reopen();
  CHECK(e.store->last_tx_id() == tx);
  CHECK(e.lc->GetModel("w")->state == ModelState::kWarmup);
  CHECK(e.lc->GetModel("w")->live_messages == 1);
  CHECK(e.lc->GetModel("i")->state == ModelState::kInference);
  CHECK(e.lc->GetModel("gone")->state == ModelState::kEvicted);
  CHECK(e.lc->GetModel("gone")->reason == "drained");
  CHECK(e.lc->GetMessage("p1")->state == MessageState::kExpired);
  CHECK(e.lc->GetMessage("p1")->reason == "model evicted");
  CHECK(e.lc->GetMessage("p")->state == MessageState::kPending);
  auto r = e.lc->GetMessage("r");
  CHECK(r->state == MessageState::kProcessing);
  CHECK(r->model == "i");
  CHECK(r->enqueued_ns == 0);
  CHECK(r->since_ns == 10 * kSec);
  CHECK(e.lc->GetMessage("c")->state == MessageState::kCompleted);
  const auto s = e.lc->Stats();
  CHECK(s.models_warmup == 1);
  CHECK(s.models_inference == 1);
  CHECK(s.models_evicted == 1);
  CHECK(s.messages_pending == 1);
  CHECK(s.messages_processing == 1);
  CHECK(s.messages_completed == 1);
  CHECK(s.messages_expired == 1);
  CHECK(s.transactions == 0);  // since Open
  CHECK(e.lc->Verify().ok());

  // Timeouts count from the committed times: w warmed up at 0 (clock now 10 s).
  e.clock.Advance(absl::Seconds(20));
  auto t = e.lc->RunTimeouts();
  REQUIRE(t.ok());
  CHECK(t->evicted_models == std::vector<std::string>{"w"});
  CHECK(t->expired_messages == std::vector<std::string>{"p"});
  // And transitions continue after the reopen.
  REQUIRE(e.lc->Complete("r").ok());
  REQUIRE(e.lc->BeginWarmup("gone").ok());
  CHECK(e.lc->GetModel("gone")->generation == 2);
  CHECK(e.store->last_tx_id() == tx + 3);
}

TEST_CASE("reopen on a clock behind the committed times starts their timeouts at Open") {
  Env e;
  e.clock.Advance(absl::Seconds(50));
  REQUIRE(e.lc->BeginWarmup("m").ok());  // since 50 s
  inferq::ManualClock fresh(0);          // e.g. the steady clock after a reboot
  e.lo.clock = &fresh;
  e.Reopen();
  CHECK(e.lc->GetModel("m")->since_ns == 50 * kSec);  // as committed
  fresh.Advance(absl::Seconds(30) - absl::Nanoseconds(1));
  CHECK(e.lc->RunTimeouts()->evicted_models.empty());
  fresh.Advance(absl::Nanoseconds(1));
  CHECK(e.lc->RunTimeouts()->evicted_models == std::vector<std::string>{"m"});
}

TEST_CASE("Open refuses malformed, unknown and inconsistent records with DataLoss naming the key") {
  state_test::TempDir d;
  auto s = StateStore::Open(state_test::Options(d.path()));
  REQUIRE(s.ok());
  StateStore& store = **s;
  auto put = [&](const std::string& k, const std::string& v) {
    auto tx = store.Begin();
    tx.Put(k, v);
    REQUIRE(tx.Commit().ok());
  };
  auto del = [&](const std::string& k) {
    auto tx = store.Begin();
    tx.Delete(k);
    REQUIRE(tx.Commit().ok());
  };
  auto open_err = [&] { return Err(Lifecycle::Open(&store, {}).status()); };
  const std::string mk = "lifecycle.model.m";
  const std::string gk = "lifecycle.msg.x";
  const std::vector<std::pair<std::string, std::string>> bad_models = {
      {"v1 warm 0 1 ", "unknown model state"},
      {"v2 warmup 0 1 ", "unknown version"},
      {"v1 warmup 0 0 ", "bad generation"},
      {"v1 warmup 0x10 1 ", "bad since_ns"},
      {"v1 warmup 0 1", "expected 5 fields"},
      {"v1 warmup 0 1 hot", "a reason must be given exactly when evicted"},
      {"v1 evicted 0 1 ", "a reason must be given exactly when evicted"},
  };
  for (const auto& [v, why] : bad_models) {
    put(mk, v);
    CHECK(open_err() == "DATA_LOSS: lifecycle key 'lifecycle.model.m' has a malformed value '" +
                            v + "': " + why);
  }
  put(mk, "v1 warmup 0 1 ");
  REQUIRE(Lifecycle::Open(&store, {}).ok());
  put(gk, "v1 pending m 0 0 late");
  CHECK(open_err() == "DATA_LOSS: lifecycle key 'lifecycle.msg.x' has a malformed value "
                      "'v1 pending m 0 0 late': a reason must be given exactly when expired");
  put(gk, "v1 processing m 0 0 ");
  CHECK(open_err() == "DATA_LOSS: lifecycle key 'lifecycle.msg.x' is processing on model 'm', "
                      "which is in warmup (broken invariant)");
  put(mk, "v1 evicted 0 1 oom");
  put(gk, "v1 pending m 0 0 ");
  CHECK(open_err() == "DATA_LOSS: lifecycle key 'lifecycle.msg.x' is pending on model 'm', "
                      "which is evicted (broken invariant)");
  put(gk, "v1 pending ghost 0 0 ");
  CHECK(open_err() == "DATA_LOSS: lifecycle key 'lifecycle.msg.x' is pending on model 'ghost', "
                      "which has no record");
  // A finished message may name a model without a record.
  put(gk, "v1 expired ghost 0 0 model evicted");
  REQUIRE(Lifecycle::Open(&store, {}).ok());
  del(gk);
  put("lifecycle.stray", "1");
  CHECK(open_err() ==
        "DATA_LOSS: lifecycle key 'lifecycle.stray' is neither a model nor a message record");
  del("lifecycle.stray");
  put("lifecycleX.other", "1");  // outside "lifecycle.": not ours
  auto lc = Lifecycle::Open(&store, {});
  REQUIRE(lc.ok());
  CHECK((*lc)->GetModel("m")->reason == "oom");
}

TEST_CASE("a failed Commit changes nothing in memory and returns the store's error") {
  Env e(/*faulty=*/true);
  REQUIRE(e.lc->BeginWarmup("m").ok());
  REQUIRE(e.lc->ModelReady("m").ok());
  REQUIRE(e.lc->Enqueue("x", "m").ok());
  REQUIRE(e.lc->Enqueue("y", "m").ok());
  e.fs->FailNth("write", 1, EIO);
  const absl::Status st = e.lc->StartProcessing("x");
  CHECK(st.code() == absl::StatusCode::kDataLoss);
  CHECK(std::string(st.message()).find("injected EIO") != std::string::npos);
  CHECK(e.lc->GetMessage("x")->state == MessageState::kPending);
  // The store is now failed: every later transition is refused, nothing changes.
  const auto ev = e.lc->Evict("m", "oom");
  CHECK(ev.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(e.lc->GetModel("m")->state == ModelState::kInference);
  CHECK(e.lc->GetMessage("y")->state == MessageState::kPending);
  CHECK(e.lc->Enqueue("z", "m").code() == absl::StatusCode::kFailedPrecondition);
  CHECK(Err(e.lc->GetMessage("z").status()) == "NOT_FOUND: message 'z' is unknown");
  e.clock.Advance(absl::Hours(1));
  CHECK(e.lc->RunTimeouts()->expired_messages.empty());  // nothing was Processing
  const auto s = e.lc->Stats();
  CHECK(s.failed_commits == 3);
  CHECK(s.transactions == 4);
  CHECK(s.messages_pending == 2);
  CHECK(s.models_inference == 1);
  // After a reopen the store holds what memory held.
  e.Reopen();
  CHECK(e.lc->GetMessage("x")->state == MessageState::kPending);
  CHECK(e.lc->GetModel("m")->state == ModelState::kInference);
  CHECK(e.lc->Verify().ok());
}

TEST_CASE("threads: random transitions keep the invariant and memory equal to the store") {
  state_test::TempDir d;
  auto o = state_test::Options(d.path());
  o.sync = inferq::SyncPolicy::kGroupCommit;
  auto s = StateStore::Open(o);
  REQUIRE(s.ok());
  inferq::ManualClock clock;
  inferq::LifecycleOptions lo;
  lo.clock = &clock;
  lo.warmup_timeout = absl::Milliseconds(3);
  lo.inference_timeout = absl::Milliseconds(2);
  auto lco = Lifecycle::Open(s->get(), lo);
  REQUIRE(lco.ok());
  Lifecycle& lc = **lco;
  const std::vector<std::string> models = {"m0", "m1", "m2"};
  std::atomic<bool> stop{false};
  std::atomic<int> unexpected{0};
  std::atomic<int> verify_failures{0};
  auto check = [&](const absl::Status& st) {
    if (!st.ok() && st.code() != absl::StatusCode::kFailedPrecondition &&
        st.code() != absl::StatusCode::kNotFound &&
        st.code() != absl::StatusCode::kAlreadyExists) {
      unexpected.fetch_add(1);
    }
  };
  std::vector<std::thread> ts;
  for (int w = 0; w < 4; ++w) {
    ts.emplace_back([&, w] {
      std::mt19937 rng(1234 + w);
      auto pick = [&](int k) { return std::uniform_int_distribution<int>(0, k - 1)(rng); };
      for (int i = 0; i < 400; ++i) {
        const std::string& model = models[pick(3)];
        // Shared ids, so threads race on the same messages (and on Enqueue of one id).
        const std::string id = "g" + std::to_string(pick(40));
        switch (pick(9)) {
          case 0: check(lc.BeginWarmup(model)); break;
          case 1: check(lc.ModelReady(model)); break;
          case 2: if (pick(3) == 0) check(lc.Evict(model, "test").status()); break;
          case 3: check(lc.Enqueue(id, model)); break;
          case 4: check(lc.StartProcessing(id)); break;
          case 5: check(lc.Complete(id)); break;
          case 6: check(lc.Expire(id, "test")); break;
          case 7: check(lc.Forget(id)); break;
          case 8: clock.Advance(absl::Microseconds(500)); check(lc.RunTimeouts().status()); break;
        }
      }
    });
  }
  std::thread verifier([&] {
    while (!stop.load()) {
      if (!lc.Verify().ok()) verify_failures.fetch_add(1);
    }
  });
  for (auto& t : ts) t.join();
  stop = true;
  verifier.join();
  CHECK(unexpected.load() == 0);
  CHECK(verify_failures.load() == 0);
  const absl::Status v = lc.Verify();
  INFO(v.ToString());
  CHECK(v.ok());
  const auto st = lc.Stats();
  CHECK(st.transactions == (*s)->last_tx_id());
  CHECK(st.failed_commits == 0);
  // The per-state counts match the records.
  std::uint64_t per_state[4] = {0, 0, 0, 0};
  for (int i = 0; i < 40; ++i) {
    auto g = lc.GetMessage("g" + std::to_string(i));
    if (g.ok()) ++per_state[static_cast<int>(g->state)];
  }
  CHECK(per_state[0] == st.messages_pending);
  CHECK(per_state[1] == st.messages_processing);
  CHECK(per_state[2] == st.messages_completed);
  CHECK(per_state[3] == st.messages_expired);
  // And a reopen sees the same.
  lco->reset();
  auto again = Lifecycle::Open(s->get(), lo);
  REQUIRE(again.ok());
  CHECK((*again)->Verify().ok());
  const auto st2 = (*again)->Stats();
  CHECK(st2.messages_pending == st.messages_pending);
  CHECK(st2.messages_processing == st.messages_processing);
  CHECK(st2.models_warmup == st.models_warmup);
  CHECK(st2.models_inference == st.models_inference);
  CHECK(st2.models_evicted == st.models_evicted);
}

// ---------------------------------------------------------------------------------
// Crash test.

namespace {

int ModelRank(const std::string& state) {
  return state == "warmup" ? 0 : state == "inference" ? 1 : state == "evicted" ? 2 : -100;
}
int MessageRank(const std::string& state) {
  return state == "pending" ? 0 : state == "processing" ? 1 : 2;  // completed/expired: 2
}

struct Acked {
  std::map<std::string, std::pair<std::uint64_t, int>> models;  // -> (generation, rank)
  std::map<std::string, std::string> messages;                   // -> most advanced state
  std::uint64_t lines = 0;
};

void RunChildAndKill(const std::string& dir, int run, int run_ms, Acked& acked,
                     std::string& child_err) {
  int out[2];
  REQUIRE(::pipe(out) == 0);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  posix_spawn_file_actions_addclose(&fa, out[0]);
  const std::string exe = INFERQ_LIFECYCLE_CRASH_CHILD;
  std::string run_s = std::to_string(run), threads = "3", seed = std::to_string(977 * run + 5);
  char* argv[] = {const_cast<char*>(exe.c_str()), const_cast<char*>(dir.c_str()), run_s.data(),
                  threads.data(), seed.data(), nullptr};
  pid_t pid = 0;
  REQUIRE(posix_spawn(&pid, exe.c_str(), &fa, nullptr, argv, environ) == 0);
  posix_spawn_file_actions_destroy(&fa);
  ::close(out[1]);
  std::string data;
  char buf[65536];
  // The run starts when the child reports its first transition (Open and a
  // sanitizer runtime take a while), then lasts run_ms.
  auto deadline = std::chrono::steady_clock::time_point::max();
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  bool killed = false;
  for (;;) {
    const auto now = std::chrono::steady_clock::now();
    if (!killed && (now >= deadline || now >= give_up)) {
      ::kill(pid, SIGKILL);
      killed = true;
    }
    pollfd p{out[0], POLLIN, 0};
    if (::poll(&p, 1, killed ? 1000 : 1) < 0) continue;
    if (p.revents & (POLLIN | POLLHUP)) {
      const ssize_t n = ::read(out[0], buf, sizeof(buf));
      if (n <= 0) break;
      data.append(buf, static_cast<std::size_t>(n));
      if (deadline == std::chrono::steady_clock::time_point::max()) {
        deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(run_ms);
      }
    }
  }
  ::close(out[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)) {
    child_err = "child ended by itself, status " + std::to_string(status);
  }
  std::istringstream lines(data);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream ls(line);
    std::string kind, name, state;
    if (!(ls >> kind >> name)) {
      child_err = "bad line from the child: " + line;
      return;
    }
    if (kind == "M") {
      std::uint64_t gen = 0;
      if (!(ls >> gen >> state) || ModelRank(state) < 0) {
        child_err = "bad line from the child: " + line;
        return;
      }
      auto& a = acked.models[name];
      a = std::max(a, std::make_pair(gen, ModelRank(state)));
    } else if (kind == "G" && (ls >> state)) {
      std::string& a = acked.messages[name];
      if (a.empty() || MessageRank(state) > MessageRank(a)) a = state;
    } else {
      child_err = "bad line from the child: " + line;
      return;
    }
    ++acked.lines;
  }
}

// The invariant, read from the store's raw records (the documented encoding), not
// through Lifecycle.
std::string RawInvariantViolation(const StateStore& store) {
  std::map<std::string, std::string> model_state;
  std::vector<std::pair<std::string, std::string>> msgs;
  store.Scan("lifecycle.", [&](std::string_view k, std::string_view v) {
    std::istringstream in{std::string(v)};
    std::string ver, state, model;
    in >> ver >> state;
    if (k.rfind("lifecycle.model.", 0) == 0) {
      model_state[std::string(k.substr(16))] = state;
    } else {
      in >> model;
      msgs.emplace_back(std::string(k) + " " + state, model);
    }
  });
  for (const auto& [ks, model] : msgs) {
    const std::string state = ks.substr(ks.rfind(' ') + 1);
    const std::string ms = model_state.count(model) ? model_state[model] : "absent";
    if (state == "pending" && ms != "warmup" && ms != "inference") return ks + " on " + ms;
    if (state == "processing" && ms != "inference") return ks + " on " + ms;
  }
  return "";
}

}  // namespace

TEST_CASE("SIGKILL during random transitions: acknowledged states survive, invariant holds") {
  std::mt19937 rng(20260301);
  state_test::TempDir d;
  Acked acked;
  int kills = 0;
  for (int run = 1; run <= 30; ++run) {
    std::string child_err;
    const int run_ms = std::uniform_int_distribution<int>(5, 60)(rng);
    RunChildAndKill(d.path(), run, run_ms, acked, child_err);
    INFO("run " << run << " killed after " << run_ms << " ms");
    REQUIRE(child_err.empty());
    ++kills;
    auto s = StateStore::Open(state_test::Options(d.path()));
    INFO(s.status().ToString());
    REQUIRE(s.ok());
    REQUIRE((*s)->VerifyChain().ok());
    CHECK(RawInvariantViolation(**s) == "");
    auto lc = Lifecycle::Open(s->get(), {});  // validates every record and the invariant
    INFO(lc.status().ToString());
    REQUIRE(lc.ok());
    CHECK((*lc)->Verify().ok());
    for (const auto& [model, want] : acked.models) {
      auto m = (*lc)->GetModel(model);
      INFO("model " << model);
      REQUIRE(m.ok());
      const auto got = std::make_pair(m->generation, ModelRank(std::string(
                                                         inferq::ModelStateName(m->state))));
      CHECK(got >= want);
    }
    int lost = 0, regressed = 0;
    for (const auto& [id, want] : acked.messages) {
      auto g = (*lc)->GetMessage(id);
      if (!g.ok()) {
        ++lost;
        continue;
      }
      const std::string got(inferq::MessageStateName(g->state));
      // A finished state is final; otherwise at least as far as acknowledged.
      if (MessageRank(want) == 2 ? got != want : MessageRank(got) < MessageRank(want)) {
        ++regressed;
        FAIL_CHECK("message " << id << " acknowledged " << want << ", recovered " << got);
      }
    }
    CHECK(lost == 0);
    CHECK(regressed == 0);
  }
  CHECK(kills == 30);
  CHECK(acked.models.size() == 4);
  CHECK(acked.messages.size() > 100);
  WARN("kills: " << kills << ", acknowledged lines: " << acked.lines
                 << ", messages: " << acked.messages.size());
}

TEST_CASE("the engine's timer applies the lifecycle's timeouts") {
  Env env;
  auto engine = inferq::Engine::Create({.clock = &env.clock, .manual_timers = true, .lifecycle = env.lc.get()}).value();
  REQUIRE(env.lc->BeginWarmup("llama").ok());
  REQUIRE(env.lc->Enqueue("m1", "llama").ok());
  env.clock.Advance(absl::Seconds(30) - absl::Nanoseconds(1));
  engine->RunTimers();
  CHECK(env.lc->GetModel("llama")->state == inferq::ModelState::kWarmup);
  env.clock.Advance(absl::Nanoseconds(1));
  engine->RunTimers();
  CHECK(env.lc->GetModel("llama")->state == inferq::ModelState::kEvicted);
  CHECK(env.lc->GetModel("llama")->reason == "warmup timeout");
  CHECK(env.lc->GetMessage("m1")->state == inferq::MessageState::kExpired);
  CHECK(env.lc->Verify().ok());
}

TEST_CASE("Requeue moves a Processing message back to Pending in one transaction") {
  Env e;
  REQUIRE(e.lc->BeginWarmup("m").ok());
  REQUIRE(e.lc->ModelReady("m").ok());
  REQUIRE(e.lc->Enqueue("r", "m").ok());
  REQUIRE(e.lc->StartProcessing("r").ok());
  e.clock.Advance(absl::Seconds(7));
  const std::uint64_t tx = e.store->last_tx_id();
  REQUIRE(e.lc->Requeue("r").ok());
  CHECK(e.store->last_tx_id() == tx + 1);
  CHECK(e.Raw("lifecycle.msg.r") == "v1 pending m 0 7000000000 ");
  CHECK(e.lc->Stats().messages_pending == 1);
  CHECK(e.lc->Stats().messages_processing == 0);
  REQUIRE(e.lc->StartProcessing("r").ok());
  e.Reopen();
  CHECK(e.lc->GetMessage("r")->state == MessageState::kProcessing);
  CHECK(e.lc->Verify().ok());
}
