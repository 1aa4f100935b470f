// File: inferq/inferq.hpp
//
// Umbrella header: everything a host program needs to embed inferq.
//
//   #include "inferq/inferq.hpp"
//   auto engine = inferq::Engine::Create();  // absl::StatusOr<std::unique_ptr<Engine>>
#pragma once

#include "inferq/base/cache_line.hpp"
#include "inferq/base/clock.hpp"
#include "inferq/base/histogram.hpp"
#include "inferq/engine/engine.hpp"
#include "inferq/event/codec.hpp"
#include "inferq/event/event.hpp"
#include "inferq/memory/buffer.hpp"
#include "inferq/ring/mpmc_ring.hpp"
#include "inferq/routing/predicate.hpp"
#include "inferq/routing/selection.hpp"
#include "inferq/routing/subject.hpp"
#include "inferq/routing/subject_index.hpp"
#include "inferq/sched/batcher.hpp"
#include "inferq/sched/qos_scheduler.hpp"
#include "inferq/schema/registry.hpp"
#include "inferq/state/state_schema_store.hpp"
#include "inferq/state/state_store.hpp"
#include "inferq/version.hpp"
