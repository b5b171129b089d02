"""DeltaBlue-like incremental constraint solver: variables, stay/edit/equality/scale
constraints with a strength hierarchy, incremental add/remove and plan extraction.
(Own implementation of the published algorithm; chain and projection scenarios.)"""

from _harness import SCALE, bench_main

REQUIRED, STRONG_PREFERRED, PREFERRED, STRONG_DEFAULT, NORMAL, WEAK_DEFAULT, WEAKEST = range(7)
NONE, FORWARD, BACKWARD = 0, 1, 2


def stronger(a, b):
    return a < b


def weaker(a, b):
    return a > b


def weakest_of(a, b):
    return a if a > b else b


class Variable:
    def __init__(self, name, value=0):
        self.name = name
        self.value = value
        self.constraints = []
        self.determined_by = None
        self.mark = 0
        self.walk_strength = WEAKEST
        self.stay = True

    def add_constraint(self, c):
        self.constraints.append(c)

    def remove_constraint(self, c):
        self.constraints.remove(c)
        if self.determined_by is c:
            self.determined_by = None


class Constraint:
    def __init__(self, planner, strength):
        self.planner = planner
        self.strength = strength

    def add(self):
        self.add_to_graph()
        self.planner.incremental_add(self)

    def destroy(self):
        if self.is_satisfied():
            self.planner.incremental_remove(self)
        else:
            self.remove_from_graph()

    def is_input(self):
        return False

    def satisfy(self, mark):
        self.choose_method(mark)
        if not self.is_satisfied():
            if self.strength == REQUIRED:
                raise RuntimeError("could not satisfy a required constraint")
            return None
        self.mark_inputs(mark)
        out = self.output()
        overridden = out.determined_by
        if overridden is not None:
            overridden.mark_unsatisfied()
        out.determined_by = self
        if not self.planner.add_propagate(self, mark):
            raise RuntimeError("cycle encountered")
        out.mark = mark
        return overridden


class UnaryConstraint(Constraint):
    def __init__(self, planner, v, strength):
        super().__init__(planner, strength)
        self.my_output = v
        self.satisfied = False
        self.add()

    def add_to_graph(self):
        self.my_output.add_constraint(self)
        self.satisfied = False

    def choose_method(self, mark):
        o = self.my_output
        self.satisfied = o.mark != mark and stronger(self.strength, o.walk_strength)

    def is_satisfied(self):
        return self.satisfied

    def mark_inputs(self, mark):
        pass

    def output(self):
        return self.my_output

    def recalculate(self):
        o = self.my_output
        o.walk_strength = self.strength
        o.stay = not self.is_input()
        if o.stay:
            self.execute()

    def mark_unsatisfied(self):
        self.satisfied = False

    def inputs_known(self, mark):
        return True

    def remove_from_graph(self):
        if self.my_output is not None:
            self.my_output.remove_constraint(self)
        self.satisfied = False


class StayConstraint(UnaryConstraint):
    def execute(self):
        pass


class EditConstraint(UnaryConstraint):
    def is_input(self):
        return True

    def execute(self):
        pass


class BinaryConstraint(Constraint):
    def __init__(self, planner, v1, v2, strength, add=True):
        super().__init__(planner, strength)
        self.v1 = v1
        self.v2 = v2
        self.direction = NONE
        if add:
            self.add()

    def choose_method(self, mark):
        v1, v2, s = self.v1, self.v2, self.strength
        if v1.mark == mark:
            self.direction = FORWARD if (v2.mark != mark and stronger(s, v2.walk_strength)) else NONE
        elif v2.mark == mark:
            self.direction = BACKWARD if (v1.mark != mark and stronger(s, v1.walk_strength)) else NONE
        elif weaker(v1.walk_strength, v2.walk_strength):
            self.direction = BACKWARD if stronger(s, v1.walk_strength) else NONE
        else:
            self.direction = FORWARD if stronger(s, v2.walk_strength) else NONE

    def add_to_graph(self):
        self.v1.add_constraint(self)
        self.v2.add_constraint(self)
        self.direction = NONE

    def is_satisfied(self):
        return self.direction != NONE

    def mark_inputs(self, mark):
        self.input().mark = mark

    def input(self):
        return self.v1 if self.direction == FORWARD else self.v2

    def output(self):
        return self.v2 if self.direction == FORWARD else self.v1

    def recalculate(self):
        ihn, out = self.input(), self.output()
        out.walk_strength = weakest_of(self.strength, ihn.walk_strength)
        out.stay = ihn.stay
        if out.stay:
            self.execute()

    def mark_unsatisfied(self):
        self.direction = NONE

    def inputs_known(self, mark):
        i = self.input()
        return i.mark == mark or i.stay or i.determined_by is None

    def remove_from_graph(self):
        self.v1.remove_constraint(self)
        self.v2.remove_constraint(self)
        self.direction = NONE


class EqualityConstraint(BinaryConstraint):
    def execute(self):
        self.output().value = self.input().value


class ScaleConstraint(BinaryConstraint):
    def __init__(self, planner, src, scale, offset, dest, strength):
        super().__init__(planner, src, dest, strength, add=False)
        self.scale = scale
        self.offset = offset
        self.add()

    def add_to_graph(self):
        super().add_to_graph()
        self.scale.add_constraint(self)
        self.offset.add_constraint(self)

    def remove_from_graph(self):
        super().remove_from_graph()
        self.scale.remove_constraint(self)
        self.offset.remove_constraint(self)

    def mark_inputs(self, mark):
        super().mark_inputs(mark)
        self.scale.mark = self.offset.mark = mark

    def execute(self):
        if self.direction == FORWARD:
            self.v2.value = self.v1.value * self.scale.value + self.offset.value
        else:
            self.v1.value = (self.v2.value - self.offset.value) // self.scale.value

    def recalculate(self):
        ihn, out = self.input(), self.output()
        out.walk_strength = weakest_of(self.strength, ihn.walk_strength)
        out.stay = ihn.stay and self.scale.stay and self.offset.stay
        if out.stay:
            self.execute()


class Planner:
    def __init__(self):
        self.current_mark = 0

    def new_mark(self):
        self.current_mark += 1
        return self.current_mark

    def incremental_add(self, c):
        mark = self.new_mark()
        overridden = c.satisfy(mark)
        while overridden is not None:
            overridden = overridden.satisfy(mark)

    def incremental_remove(self, c):
        out = c.output()
        c.mark_unsatisfied()
        c.remove_from_graph()
        unsatisfied = self.remove_propagate_from(out)
        for strength in range(REQUIRED, WEAKEST):
            for u in unsatisfied:
                if u.strength == strength:
                    self.incremental_add(u)

    def add_propagate(self, c, mark):
        todo = [c]
        while todo:
            d = todo.pop()
            if d.output().mark == mark:
                self.incremental_remove(c)
                return False
            d.recalculate()
            self.add_constraints_consuming_to(d.output(), todo)
        return True

    def remove_propagate_from(self, out):
        out.determined_by = None
        out.walk_strength = WEAKEST
        out.stay = True
        unsatisfied = []
        todo = [out]
        while todo:
            v = todo.pop()
            for c in v.constraints:
                if not c.is_satisfied():
                    unsatisfied.append(c)
            determining = v.determined_by
            for nxt in v.constraints:
                if nxt is not determining and nxt.is_satisfied():
                    nxt.recalculate()
                    todo.append(nxt.output())
        return unsatisfied

    def extract_plan(self, constraints):
        sources = [c for c in constraints if c.is_input() and c.is_satisfied()]
        mark = self.new_mark()
        plan = []
        todo = sources
        while todo:
            c = todo.pop(0)
            if c.output().mark != mark and c.inputs_known(mark):
                plan.append(c)
                c.output().mark = mark
                self.add_constraints_consuming_to(c.output(), todo)
        return plan

    @staticmethod
    def add_constraints_consuming_to(v, coll):
        determining = v.determined_by
        for c in v.constraints:
            if c is not determining and c.is_satisfied():
                coll.append(c)


def execute_plan(plan):
    for c in plan:
        c.execute()


def chain_test(n):
    p = Planner()
    prev = first = last = None
    for i in range(n + 1):
        v = Variable("v%d" % i)
        if prev is not None:
            EqualityConstraint(p, prev, v, REQUIRED)
        if i == 0:
            first = v
        if i == n:
            last = v
        prev = v
    StayConstraint(p, last, STRONG_DEFAULT)
    edit = EditConstraint(p, first, PREFERRED)
    plan = p.extract_plan([edit])
    for i in range(100):
        first.value = i
        execute_plan(plan)
        if last.value != i:
            raise AssertionError("chain test failed")
    return last.value


def change(p, v, new_value):
    edit = EditConstraint(p, v, PREFERRED)
    plan = p.extract_plan([edit])
    for _ in range(10):
        v.value = new_value
        execute_plan(plan)
    edit.destroy()


def projection_test(n):
    p = Planner()
    scale = Variable("scale", 10)
    offset = Variable("offset", 1000)
    src = dst = None
    dests = []
    for i in range(n):
        src = Variable("src%d" % i, i)
        dst = Variable("dst%d" % i, i)
        dests.append(dst)
        StayConstraint(p, src, NORMAL)
        ScaleConstraint(p, src, scale, offset, dst, REQUIRED)
    change(p, src, 17)
    if dst.value != 1170:
        raise AssertionError("projection 1")
    change(p, dst, 1050)
    if src.value != 5:
        raise AssertionError("projection 2")
    change(p, scale, 5)
    for i in range(n - 1):
        if dests[i].value != i * 5 + 1000:
            raise AssertionError("projection 3")
    change(p, offset, 2000)
    for i in range(n - 1):
        if dests[i].value != i * 5 + 2000:
            raise AssertionError("projection 4")
    return sum(d.value for d in dests)


def run(scale):
    reps = max(1, int(75 * scale))
    acc = 0
    for _ in range(reps):
        acc += chain_test(200)
        acc += projection_test(200)
    return acc


if __name__ == "__main__":
    bench_main(run)
