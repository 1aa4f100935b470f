// File: src/adapters/nats/fetch.hpp (internal to the NATS bridge)
//
// FetchQueuedFirst: natsSubscription_Fetch of a pull subscription without libnats
// 3.4.1's overflow. When messages of an earlier pull that expired are queued in the
// subscription, 3.4.1's fetch takes them first, then lowers the batch it counts to
// by as many and waits until its count equals that lower batch: when the queued
// messages were more than half the batch, the count has passed it already, and the
// fetch writes further messages past the end of its array (heap overflow; fixed in
// later versions, which count to the batch asked for). While any message is queued
// this takes one (a fetch of 1 never passes its batch); else it fetches `batch`.
// Found by AddressSanitizer in a replica process of the main example across processes.
// Thread safety: as natsSubscription_Fetch (one fetch at a time per subscription).
#pragma once

#include <cstdint>

#include <nats/nats.h>

namespace inferq::nats::internal {

inline natsStatus FetchQueuedFirst(natsMsgList* list, natsSubscription* sub, int batch, std::int64_t timeout_ms,
                                   jsErrCode* code) {
  int queued = 0;
  if (natsSubscription_GetPending(sub, &queued, nullptr) == NATS_OK && queued > 0) batch = 1;
  return natsSubscription_Fetch(list, sub, batch, timeout_ms, code);
}

}  // namespace inferq::nats::internal
