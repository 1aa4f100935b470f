// FetchQueuedFirst (src/adapters/nats/fetch.hpp), the bridge's fetch, against a real
// nats-server. libnats 3.4.1's natsSubscription_Fetch writes past its array when the
// messages of an earlier, expired pull are queued in the subscription and make up
// more than half the batch while more arrive (AddressSanitizer found it in a replica
// process of the main example); FetchQueuedFirst takes queued messages one at a time.
#include <catch2/catch.hpp>
#include <nats/nats.h>

#include <string>
#include <vector>

#include "../../src/adapters/nats/fetch.hpp"
#include "nats_test_util.hpp"

using namespace inferq_test;
using inferq::nats::internal::FetchQueuedFirst;

namespace {

std::string Data(natsMsg* m) { return std::string(natsMsg_GetData(m), static_cast<std::size_t>(natsMsg_GetDataLength(m))); }

}  // namespace

TEST_CASE_METHOD(OneServer, "the bridge's fetch takes queued messages of an earlier pull one at a time, then fetches a batch") {
  client.AddStream("JOBS", "jobs.>");
  for (int i = 0; i < 10; ++i) client.Publish("jobs.x", "job-" + std::to_string(i), {});
  natsSubscription* sub = nullptr;
  jsSubOptions so;
  jsSubOptions_Init(&so);
  so.ManualAck = true;
  so.Config.AckPolicy = js_AckExplicit;
  jsErrCode code = static_cast<jsErrCode>(0);
  REQUIRE(js_PullSubscribe(&sub, client.js, "jobs.>", "d", nullptr, &so, &code) == NATS_OK);
  // A pull of 3 as an earlier fetch would have sent it, answered on the
  // subscription's inbox (libnats 3.4.1 sends its pulls with it as reply subject):
  // its 3 messages wait in the subscription, as those of a pull that expired
  // before they arrived.
  const std::string inbox = natsSubscription_GetSubject(sub);
  REQUIRE(natsConnection_PublishRequestString(client.nc, "$JS.API.CONSUMER.MSG.NEXT.JOBS.d", inbox.c_str(),
                                              "{\"batch\":3}") == NATS_OK);
  REQUIRE(WaitFor([&] {
    int queued = 0;
    return natsSubscription_GetPending(sub, &queued, nullptr) == NATS_OK && queued == 3;
  }));

  std::vector<int> counts;
  std::vector<std::string> got;
  while (got.size() < 10) {
    natsMsgList list{};
    const natsStatus s = FetchQueuedFirst(&list, sub, 4, 2000, &code);
    REQUIRE(s == NATS_OK);
    counts.push_back(list.Count);
    for (int i = 0; i < list.Count; ++i) {
      got.push_back(Data(list.Msgs[i]));
      REQUIRE(natsMsg_Ack(list.Msgs[i], nullptr) == NATS_OK);
    }
    natsMsgList_Destroy(&list);
  }
  // The 3 queued one by one (libnats' fetch of 4 took them together and then
  // counted to 1), then batches of 4 and the remaining 3.
  CHECK(counts == std::vector<int>{1, 1, 1, 4, 3});
  std::vector<std::string> want;
  for (int i = 0; i < 10; ++i) want.push_back("job-" + std::to_string(i));
  CHECK(got == want);
  natsSubscription_Destroy(sub);
}
