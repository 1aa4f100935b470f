#include "inferq/schema/schema_reader.hpp"

#include <algorithm>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <flatbuffers/reflection.h>

#include "inferq/schema/registry.hpp"

namespace inferq {
namespace {

using reflection::BaseType;

// How one reader table is read from one writer table: the reader's fields by id, each
// with the writer's field of the same id (or none).
struct Slot {
  const reflection::Field* r = nullptr;
  const reflection::Field* w = nullptr;  // nullptr: the writer lacks or deprecated it
  int child = -1;  // TablePlan index for a table or vector-of-tables field
};
struct TablePlan {
  const reflection::Object* r_obj = nullptr;
  const reflection::Object* w_obj = nullptr;
  std::vector<Slot> slots;
  std::vector<const reflection::Field*> w_only;  // writer fields the reader does not read
};

// The resolution of writer schema W against reader schema R, computed once per pair.
struct Plan {
  std::shared_ptr<const std::string> w_bfbs;
  std::shared_ptr<const std::string> r_bfbs;
  const reflection::Schema* w = nullptr;
  const reflection::Schema* r = nullptr;
  std::string w_label;  // "subject 's' version 2", for errors
  std::uint64_t w_id = 0;
  std::vector<TablePlan> tables;  // [0]: the root tables
};

std::string TypeName(const reflection::Schema& s, const reflection::Type& t) {
  const BaseType bt = t.base_type();
  if (bt == BaseType::Obj) return s.objects()->Get(t.index())->name()->str();
  if (bt == BaseType::Vector) {
    if (t.element() == BaseType::Obj) {
      return "[" + s.objects()->Get(t.index())->name()->str() + "]";
    }
    return std::string("[") + reflection::EnumNameBaseType(t.element()) + "]";
  }
  if (t.index() >= 0 && flatbuffers::IsInteger(bt)) {
    return s.enums()->Get(t.index())->name()->str() + " (" + reflection::EnumNameBaseType(bt) + ")";
  }
  return reflection::EnumNameBaseType(bt);
}

std::vector<const reflection::Field*> ById(const reflection::Object& obj) {
  std::vector<const reflection::Field*> out(obj.fields()->begin(), obj.fields()->end());
  std::sort(out.begin(), out.end(),
            [](const reflection::Field* a, const reflection::Field* b) { return a->id() < b->id(); });
  return out;
}

class PlanBuilder {
 public:
  PlanBuilder(Plan& plan, const std::string& r_label) : p_(plan), r_label_(r_label) {}

  absl::StatusOr<int> Table(std::int32_t r_index, std::int32_t w_index) {
    const auto key = std::make_pair(r_index, w_index);
    if (auto it = memo_.find(key); it != memo_.end()) return it->second;
    const int index = static_cast<int>(p_.tables.size());
    memo_.emplace(key, index);
    p_.tables.emplace_back();
    const reflection::Object* r_obj = p_.r->objects()->Get(r_index);
    const reflection::Object* w_obj = p_.w->objects()->Get(w_index);
    p_.tables[index].r_obj = r_obj;
    p_.tables[index].w_obj = w_obj;

    std::map<std::uint16_t, const reflection::Field*> w_by_id;
    for (const reflection::Field* f : *w_obj->fields()) w_by_id.emplace(f->id(), f);
    std::vector<bool> w_read(w_by_id.size() == 0 ? 0 : w_by_id.rbegin()->first + 1u, false);

    std::vector<Slot> slots;
    for (const reflection::Field* rf : ById(*r_obj)) {
      if (rf->deprecated()) continue;
      if (absl::Status s = Supported(*p_.r, *r_obj, *rf, r_label_); !s.ok()) return s;
      Slot slot{rf, nullptr, -1};
      auto it = w_by_id.find(rf->id());
      if (it != w_by_id.end() && !it->second->deprecated()) {
        const reflection::Field* wf = it->second;
        w_read[wf->id()] = true;
        absl::StatusOr<int> child = Match(*r_obj, *rf, *wf);
        if (!child.ok()) return child.status();
        slot.w = wf;
        slot.child = *child;
      }
      slots.push_back(slot);
    }
    std::vector<const reflection::Field*> w_only;
    for (const auto& [id, wf] : w_by_id) {
      if (!wf->deprecated() && !w_read[id]) w_only.push_back(wf);
    }
    p_.tables[index].slots = std::move(slots);
    p_.tables[index].w_only = std::move(w_only);
    return index;
  }

 private:
  std::string FieldName(const reflection::Object& obj, const reflection::Field& f) const {
    return "field '" + obj.name()->str() + "." + f.name()->str() + "' (id " +
           std::to_string(f.id()) + ")";
  }

  // Unions and fixed-length arrays are not read (a struct's arrays included).
  absl::Status Supported(const reflection::Schema& s, const reflection::Object& obj,
                         const reflection::Field& f, const std::string& label) const {
    const BaseType bt = f.type()->base_type();
    const BaseType et = f.type()->element();
    if (bt == BaseType::Union || bt == BaseType::UType || bt == BaseType::Array ||
        (bt == BaseType::Vector && (et == BaseType::Union || et == BaseType::UType))) {
      return absl::UnimplementedError(
          label + ": " + FieldName(obj, f) + " is a " +
          (bt == BaseType::Array ? "fixed-length array" : "union") +
          ", which schema-on-read does not read");
    }
    const bool is_obj = bt == BaseType::Obj || (bt == BaseType::Vector && et == BaseType::Obj);
    if (is_obj) {
      const reflection::Object* o = s.objects()->Get(f.type()->index());
      if (o->is_struct()) {
        for (const reflection::Field* sf : *o->fields()) {
          if (absl::Status st = Supported(s, *o, *sf, label); !st.ok()) return st;
        }
      }
    }
    return absl::OkStatus();
  }

  absl::Status Conflict(const reflection::Object& r_obj, const reflection::Field& rf,
                        const reflection::Field& wf, const std::string& why) const {
    return absl::FailedPreconditionError(
        FieldName(r_obj, rf) + " is " + TypeName(*p_.r, *rf.type()) + " in " + r_label_ +
        " but " + TypeName(*p_.w, *wf.type()) + " ('" + wf.name()->str() + "') in " +
        p_.w_label + why);
  }

  // Same layout: same size, and the same fields at the same offsets by id.
  bool SameStruct(const reflection::Object& r, const reflection::Object& w) const {
    if (r.bytesize() != w.bytesize() || r.fields()->size() != w.fields()->size()) return false;
    const std::vector<const reflection::Field*> rf = ById(r);
    const std::vector<const reflection::Field*> wf = ById(w);
    for (std::size_t i = 0; i < rf.size(); ++i) {
      const reflection::Type& rt = *rf[i]->type();
      const reflection::Type& wt = *wf[i]->type();
      if (rf[i]->id() != wf[i]->id() || rf[i]->offset() != wf[i]->offset() ||
          rt.base_type() != wt.base_type()) {
        return false;
      }
      if (rt.base_type() == BaseType::Obj &&
          !SameStruct(*p_.r->objects()->Get(rt.index()), *p_.w->objects()->Get(wt.index()))) {
        return false;
      }
    }
    return true;
  }

  // Checks that rf and wf (same id) have one type; the child plan for tables.
  absl::StatusOr<int> Match(const reflection::Object& r_obj, const reflection::Field& rf,
                            const reflection::Field& wf) {
    const reflection::Type& rt = *rf.type();
    const reflection::Type& wt = *wf.type();
    if (rt.base_type() != wt.base_type() ||
        (rt.base_type() == BaseType::Vector && rt.element() != wt.element())) {
      return Conflict(r_obj, rf, wf, "");
    }
    const bool is_obj = rt.base_type() == BaseType::Obj ||
                        (rt.base_type() == BaseType::Vector && rt.element() == BaseType::Obj);
    if (!is_obj) return -1;
    const reflection::Object& ro = *p_.r->objects()->Get(rt.index());
    const reflection::Object& wo = *p_.w->objects()->Get(wt.index());
    if (ro.is_struct() != wo.is_struct()) {
      return Conflict(r_obj, rf, wf, " (a struct on one side, a table on the other)");
    }
    if (ro.is_struct()) {
      if (!SameStruct(ro, wo)) return Conflict(r_obj, rf, wf, " (the struct layouts differ)");
      return -1;
    }
    return Table(rt.index(), wt.index());
  }

  Plan& p_;
  const std::string& r_label_;
  std::map<std::pair<std::int32_t, std::int32_t>, int> memo_;
};

absl::StatusOr<const reflection::Schema*> CheckSchema(const std::string& bfbs,
                                                      const std::string& label) {
  flatbuffers::Verifier verifier(reinterpret_cast<const std::uint8_t*>(bfbs.data()), bfbs.size());
  if (!reflection::VerifySchemaBuffer(verifier)) {
    return absl::InvalidArgumentError(label + ": not a binary schema (reflection::Schema, " +
                                      std::to_string(bfbs.size()) + " bytes)");
  }
  const reflection::Schema* s = reflection::GetSchema(bfbs.data());
  if (s->root_table() == nullptr) {
    return absl::FailedPreconditionError(label + " declares no root_type");
  }
  return s;
}

absl::StatusOr<std::shared_ptr<const Plan>> MakePlan(std::shared_ptr<const std::string> w_bfbs,
                                                     std::string w_label, std::uint64_t w_id,
                                                     std::shared_ptr<const std::string> r_bfbs,
                                                     const std::string& r_label) {
  auto plan = std::make_shared<Plan>();
  plan->w_label = std::move(w_label);
  plan->w_id = w_id;
  plan->w_bfbs = std::move(w_bfbs);
  plan->r_bfbs = std::move(r_bfbs);
  absl::StatusOr<const reflection::Schema*> w = CheckSchema(*plan->w_bfbs, plan->w_label);
  if (!w.ok()) return w.status();
  absl::StatusOr<const reflection::Schema*> r = CheckSchema(*plan->r_bfbs, r_label);
  if (!r.ok()) return r.status();
  plan->w = *w;
  plan->r = *r;
  auto index_of = [](const reflection::Schema& s) {
    // root_table() points into objects(); find its index.
    for (flatbuffers::uoffset_t i = 0; i < s.objects()->size(); ++i) {
      if (s.objects()->Get(i) == s.root_table()) return static_cast<std::int32_t>(i);
    }
    return std::int32_t{-1};
  };
  const std::int32_t r_root = index_of(**r);
  const std::int32_t w_root = index_of(**w);
  if (r_root < 0 || w_root < 0) {
    return absl::InvalidArgumentError("binary schema's root table is not one of its objects");
  }
  PlanBuilder builder(*plan, r_label);
  absl::StatusOr<int> root = builder.Table(r_root, w_root);
  if (!root.ok()) return root.status();
  return std::shared_ptr<const Plan>(std::move(plan));
}

// ---------------------------------------------------------------------------------
// Reading (the buffer has been verified against the writer's schema; only fields the
// writer declares are read).

Value Scalar(BaseType bt, std::int64_t i, double f) {
  switch (bt) {
    case BaseType::Bool: return Value::Bool(i != 0);
    case BaseType::Byte:
    case BaseType::Short:
    case BaseType::Int:
    case BaseType::Long: return Value::Int(i);
    case BaseType::UByte:
    case BaseType::UShort:
    case BaseType::UInt:
    case BaseType::ULong: return Value::Uint(static_cast<std::uint64_t>(i));
    case BaseType::Float:
    case BaseType::Double: return Value::Float(f);
    default: return Value();
  }
}

Value DefaultOf(const reflection::Field& f) {
  const BaseType bt = f.type()->base_type();
  if (!flatbuffers::IsScalar(bt) || f.optional()) return Value();
  // The binary schema holds a float's default as a double (0.7); a float field reads
  // as the float nearest to it, as generated code returns it (0.7f).
  const double real = bt == BaseType::Float
                          ? static_cast<double>(static_cast<float>(f.default_real()))
                          : f.default_real();
  return Scalar(bt, f.default_integer(), real);
}

Record ReadStruct(const reflection::Schema& s, const reflection::Object& obj,
                  const flatbuffers::Struct& st) {
  std::vector<RecordField> fields;
  for (const reflection::Field* f : ById(obj)) {
    const BaseType bt = f->type()->base_type();
    Value v;
    if (bt == BaseType::Obj) {
      v = Value::Table(ReadStruct(s, *s.objects()->Get(f->type()->index()),
                                  *flatbuffers::GetFieldStruct(st, *f)));
    } else {
      v = Scalar(bt, flatbuffers::GetAnyFieldI(st, *f), flatbuffers::GetAnyFieldF(st, *f));
    }
    fields.push_back(RecordField{f->name()->str(), std::move(v), FieldOrigin::kWritten});
  }
  return Record(obj.name()->str(), std::move(fields), {});
}

Record ReadTable(const Plan& plan, int index, const flatbuffers::Table& table);

Value ReadVector(const Plan& plan, const Slot& slot, const flatbuffers::VectorOfAny& vec) {
  const reflection::Field& f = *slot.r;
  const BaseType et = f.type()->element();
  std::vector<Value> out;
  out.reserve(vec.size());
  for (flatbuffers::uoffset_t i = 0; i < vec.size(); ++i) {
    if (flatbuffers::IsScalar(et)) {
      out.push_back(Scalar(et, flatbuffers::GetAnyVectorElemI(&vec, et, i),
                           flatbuffers::GetAnyVectorElemF(&vec, et, i)));
    } else if (et == BaseType::String) {
      const auto* str = flatbuffers::GetAnyVectorElemPointer<const flatbuffers::String>(&vec, i);
      out.push_back(Value::String(str->str()));
    } else {  // Obj
      const reflection::Object& obj = *plan.r->objects()->Get(f.type()->index());
      if (obj.is_struct()) {
        const auto* st = flatbuffers::GetAnyVectorElemAddressOf<const flatbuffers::Struct>(
            &vec, i, static_cast<std::size_t>(obj.bytesize()));
        out.push_back(Value::Table(ReadStruct(*plan.r, obj, *st)));
      } else {
        const auto* t = flatbuffers::GetAnyVectorElemPointer<const flatbuffers::Table>(&vec, i);
        out.push_back(Value::Table(ReadTable(plan, slot.child, *t)));
      }
    }
  }
  return Value::Vector(std::move(out));
}

Record ReadTable(const Plan& plan, int index, const flatbuffers::Table& table) {
  const TablePlan& tp = plan.tables[static_cast<std::size_t>(index)];
  std::vector<RecordField> fields;
  fields.reserve(tp.slots.size());
  for (const Slot& slot : tp.slots) {
    const reflection::Field& f = *slot.r;
    RecordField out{f.name()->str(), Value(), FieldOrigin::kNotInWriter};
    if (slot.w == nullptr || !table.CheckField(f.offset())) {
      if (slot.w != nullptr) out.origin = FieldOrigin::kAbsent;
      out.value = DefaultOf(f);
      fields.push_back(std::move(out));
      continue;
    }
    out.origin = FieldOrigin::kWritten;
    const BaseType bt = f.type()->base_type();
    if (flatbuffers::IsScalar(bt)) {
      out.value = Scalar(bt, flatbuffers::GetAnyFieldI(table, f), flatbuffers::GetAnyFieldF(table, f));
    } else if (bt == BaseType::String) {
      out.value = Value::String(flatbuffers::GetFieldS(table, f)->str());
    } else if (bt == BaseType::Vector) {
      out.value = ReadVector(plan, slot, *flatbuffers::GetFieldAnyV(table, f));
    } else {  // Obj
      const reflection::Object& obj = *plan.r->objects()->Get(f.type()->index());
      if (obj.is_struct()) {
        out.value = Value::Table(ReadStruct(*plan.r, obj, *flatbuffers::GetFieldStruct(table, f)));
      } else {
        out.value = Value::Table(ReadTable(plan, slot.child, *flatbuffers::GetFieldT(table, f)));
      }
    }
    fields.push_back(std::move(out));
  }
  std::vector<std::string> skipped;
  for (const reflection::Field* wf : tp.w_only) {
    if (table.CheckField(wf->offset())) skipped.push_back(wf->name()->str());
  }
  return Record(tp.r_obj->name()->str(), std::move(fields), std::move(skipped));
}

// Verifies a buffer by the writer's schema with flatbuffers::Verifier's checks, for
// every field the writer declares and does not deprecate (the only ones read). This
// replaces flatbuffers::Verify (reflection.cpp), which in FlatBuffers 2.0.8 follows an
// unverified offset on some corrupt buffers: flipping one byte of a valid payload
// made it read address 0xd41 (schema_reader_test, "no single flipped byte ...").
// Union fields are skipped: the reader never reads them (SchemaRegistry::Reader
// refuses a reader with unions; a writer's unions are never matched).
class SchemaVerifier {
 public:
  SchemaVerifier(const reflection::Schema& schema, const std::uint8_t* buf, std::size_t size)
      : s_(schema), v_(buf, size), base_(buf) {}

  bool Root() {
    const flatbuffers::uoffset_t root = v_.VerifyOffset(std::size_t{0});
    if (root == 0) return false;
    return Table(*s_.root_table(), reinterpret_cast<const flatbuffers::Table*>(Base() + root));
  }

 private:
  const std::uint8_t* Base() const { return base_; }

  bool Scalar(const flatbuffers::Table& t, const reflection::Field& f, BaseType bt) {
    switch (flatbuffers::GetTypeSize(bt)) {
      case 1: return t.VerifyField<std::uint8_t>(v_, f.offset(), 1);
      case 2: return t.VerifyField<std::uint16_t>(v_, f.offset(), 2);
      case 4: return t.VerifyField<std::uint32_t>(v_, f.offset(), 4);
      case 8: return t.VerifyField<std::uint64_t>(v_, f.offset(), 8);
      default: return false;
    }
  }

  bool Table(const reflection::Object& obj, const flatbuffers::Table* t) {
    if (!t->VerifyTableStart(v_)) return false;
    const auto* data = reinterpret_cast<const std::uint8_t*>(t);
    for (const reflection::Field* f : *obj.fields()) {
      if (f->deprecated()) continue;
      const flatbuffers::voffset_t slot = t->GetOptionalFieldOffset(f->offset());
      if (slot == 0) {
        if (f->required()) return false;
        continue;
      }
      const BaseType bt = f->type()->base_type();
      if (flatbuffers::IsScalar(bt)) {
        if (!Scalar(*t, *f, bt)) return false;
        continue;
      }
      if (bt == BaseType::Union) continue;  // never read
      if (bt == BaseType::Obj) {
        const reflection::Object& child = *s_.objects()->Get(f->type()->index());
        if (child.is_struct()) {
          if (!v_.VerifyFieldStruct(data, slot, static_cast<std::size_t>(child.bytesize()),
                                    static_cast<std::size_t>(child.minalign()))) {
            return false;
          }
          continue;
        }
      }
      // String, Vector, table: an offset to verify first.
      if (!t->VerifyOffset(v_, f->offset())) return false;
      const std::uint8_t* target = t->GetPointer<const std::uint8_t*>(f->offset());
      if (bt == BaseType::String) {
        if (!v_.VerifyString(reinterpret_cast<const flatbuffers::String*>(target))) return false;
      } else if (bt == BaseType::Obj) {
        if (!Table(*s_.objects()->Get(f->type()->index()),
                   reinterpret_cast<const flatbuffers::Table*>(target))) {
          return false;
        }
      } else if (bt == BaseType::Vector) {
        if (!Vector(*f, target)) return false;
      }
    }
    return v_.EndTable();
  }

  bool Vector(const reflection::Field& f, const std::uint8_t* vec) {
    const BaseType et = f.type()->element();
    if (flatbuffers::IsScalar(et)) {
      return v_.VerifyVectorOrString(vec, flatbuffers::GetTypeSize(et));
    }
    if (et == BaseType::Union) return true;  // never read
    using Offsets = flatbuffers::Vector<flatbuffers::uoffset_t>;
    if (et == BaseType::String) {
      return v_.VerifyVectorOrString(vec, sizeof(flatbuffers::uoffset_t)) &&
             v_.VerifyVectorOfStrings(
                 reinterpret_cast<const flatbuffers::Vector<flatbuffers::Offset<flatbuffers::String>>*>(vec));
    }
    if (et != BaseType::Obj) return false;
    const reflection::Object& obj = *s_.objects()->Get(f.type()->index());
    if (obj.is_struct()) {
      return v_.VerifyVectorOrString(vec, static_cast<std::size_t>(obj.bytesize()));
    }
    if (!v_.VerifyVectorOrString(vec, sizeof(flatbuffers::uoffset_t))) return false;
    const auto* offsets = reinterpret_cast<const Offsets*>(vec);
    for (flatbuffers::uoffset_t i = 0; i < offsets->size(); ++i) {
      const std::uint8_t* elem = vec + sizeof(flatbuffers::uoffset_t) * (i + 1);
      const flatbuffers::uoffset_t o = v_.VerifyOffset(elem, 0);
      if (o == 0) return false;
      if (!Table(obj, reinterpret_cast<const flatbuffers::Table*>(elem + o))) return false;
    }
    return true;
  }

  const reflection::Schema& s_;
  flatbuffers::Verifier v_;
  const std::uint8_t* base_;
};

absl::StatusOr<Record> ReadWithPlan(const Plan& plan, std::span<const std::byte> payload) {
  const auto* buf = reinterpret_cast<const std::uint8_t*>(payload.data());
  const std::size_t size = payload.size();
  const std::string what = "payload of " + std::to_string(size) + " bytes written with " +
                           plan.w_label + " (root table " +
                           plan.w->root_table()->name()->str() + ")";
  if (size >= FLATBUFFERS_MAX_BUFFER_SIZE) {
    return absl::DataLossError(what + " is larger than a FlatBuffer can be");
  }
  if (size < sizeof(flatbuffers::uoffset_t) + sizeof(flatbuffers::soffset_t)) {
    return absl::DataLossError(what + " is too short to hold a FlatBuffer root table");
  }
  if (flatbuffers::ReadScalar<flatbuffers::uoffset_t>(buf) >= size) {
    return absl::DataLossError(what + ": its root offset points past its end");
  }
  if (!SchemaVerifier(*plan.w, buf, size).Root()) {
    return absl::DataLossError(what + " does not verify against that schema "
                               "(an offset, length or alignment is out of bounds)");
  }
  return ReadTable(plan, 0, *flatbuffers::GetAnyRoot(buf));
}

std::string VersionLabel(std::string_view subject, std::uint32_t version) {
  return "subject '" + std::string(subject) + "' version " + std::to_string(version);
}

}  // namespace

struct SchemaReader::Impl {
  const SchemaRegistry* registry = nullptr;
  std::string subject;
  std::uint32_t version = 0;
  std::string label;  // "subject 's' version 2"
  std::shared_ptr<const std::string> bfbs;
  mutable std::mutex mu;
  mutable std::map<std::uint32_t, std::shared_ptr<const Plan>> plans;  // by writer version

  absl::StatusOr<std::shared_ptr<const Plan>> PlanFor(std::uint32_t writer_version) const {
    {
      std::lock_guard<std::mutex> lock(mu);
      auto it = plans.find(writer_version);
      if (it != plans.end()) return it->second;
    }
    // Versions never change once registered: computing outside the lock and keeping
    // the first plan stored is safe.
    absl::StatusOr<RegisteredSchema> w = registry->Get(subject, writer_version);
    if (!w.ok()) return w.status();
    absl::StatusOr<std::shared_ptr<const Plan>> plan =
        MakePlan(std::make_shared<const std::string>(std::move(w->bfbs)),
                 VersionLabel(subject, writer_version), w->ref.id, bfbs, label);
    if (!plan.ok()) return plan.status();
    std::lock_guard<std::mutex> lock(mu);
    return plans.emplace(writer_version, *std::move(plan)).first->second;
  }
};

SchemaReader::SchemaReader(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

const std::string& SchemaReader::subject() const { return impl_->subject; }
std::uint32_t SchemaReader::version() const { return impl_->version; }

absl::StatusOr<Record> SchemaReader::Read(std::span<const std::byte> payload,
                                          std::uint32_t writer_version) const {
  absl::StatusOr<std::shared_ptr<const Plan>> plan = impl_->PlanFor(writer_version);
  if (!plan.ok()) return plan.status();
  return ReadWithPlan(**plan, payload);
}

absl::StatusOr<Record> SchemaReader::Read(const Event& event) const {
  absl::StatusOr<std::shared_ptr<const Plan>> plan = impl_->PlanFor(event.schema_version);
  if (!plan.ok()) return plan.status();
  if (event.schema_id != (*plan)->w_id) {
    return absl::InvalidArgumentError(
        "event schema_id " + std::to_string(event.schema_id) + " is not the id of " +
        (*plan)->w_label + " (" + std::to_string((*plan)->w_id) + ")");
  }
  if (event.codec != PayloadCodec::kNone) {
    return absl::InvalidArgumentError(
        "event payload of " + (*plan)->w_label + " is compressed (codec " +
        (event.codec == PayloadCodec::kZstd ? std::string("zstd")
                                            : std::to_string(static_cast<int>(event.codec))) +
        "); SchemaReader reads raw FlatBuffers: decompress it first, or have the "
        "consumer receive it raw (ConsumerConfig::accept_codecs = {PayloadCodec::kNone})");
  }
  return ReadWithPlan(**plan, event.payload.span());
}

absl::StatusOr<SchemaReader> SchemaRegistry::Reader(std::string_view subject,
                                                    std::uint32_t version) const {
  absl::StatusOr<RegisteredSchema> r = Get(subject, version);
  if (!r.ok()) return r.status();
  auto impl = std::make_shared<SchemaReader::Impl>();
  impl->registry = this;
  impl->subject = std::string(subject);
  impl->version = version;
  impl->label = VersionLabel(subject, version);
  impl->bfbs = std::make_shared<const std::string>(std::move(r->bfbs));
  // The reader's own version, read as itself: checks that it has a root_type and no
  // field this reader cannot read, and caches the common case.
  absl::StatusOr<std::shared_ptr<const Plan>> self =
      MakePlan(impl->bfbs, impl->label, r->ref.id, impl->bfbs, impl->label);
  if (!self.ok()) return self.status();
  impl->plans.emplace(version, *std::move(self));
  return SchemaReader(std::move(impl));
}

absl::StatusOr<Record> ReadFlatBuffer(std::span<const std::byte> payload,
                                      std::string_view writer_bfbs,
                                      std::string_view reader_bfbs) {
  absl::StatusOr<std::shared_ptr<const Plan>> plan =
      MakePlan(std::make_shared<const std::string>(writer_bfbs), "writer schema", 0,
               std::make_shared<const std::string>(reader_bfbs), "reader schema");
  if (!plan.ok()) return plan.status();
  return ReadWithPlan(**plan, payload);
}

}  // namespace inferq
