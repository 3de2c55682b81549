"""A scripted pick-and-place expert for LIBERO tasks whose goal is ``(on <object> <target>)``.

It reads the simulator's object poses (privileged state no learned policy sees) and drives the
OSC_POSE controller with proportional position commands through fixed phases: above the grasp
point, down, close, lift, above the target, down, open, up. The grasp point is on the object's
rim where its wall crosses the fingers' closing axis (a bowl is wider than the open Panda gripper, so its wall is what the
fingers close on), and the object is carried so that its centre ends above the target's centre.

Every LIBERO-Spatial task is "pick up the black bowl ... and place it on the plate", so this one
controller serves the whole suite. ``noise`` adds Gaussian noise to the executed position command
(DART-style state coverage for behaviour cloning): the recorded label is always the clean command.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

# Phases in order; the expert moves to the next when its target is reached or its step budget ends.
PHASES = ("above", "descend", "grasp", "lift", "carry", "lower", "release", "retreat")
# OSC_POSE maps an action of 1.0 to a 5 cm target offset per policy step (robosuite's output_max).
_POSITION_SCALE = 0.05


@dataclass
class ExpertSettings:
    """Geometry and gains of the scripted expert (metres, policy steps)."""

    approach_height: float = 0.10  # above the grasp point before descending
    grasp_depth: float = 0.035  # grasp point height above the object's body origin (its base)
    rim_offset: float = 0.047  # grasp this far from the object's centre, across the fingers' closing axis
    carry_height: float = 0.14  # above the target's origin while carrying
    place_height: float = 0.06  # above the target's origin when opening the gripper
    gain: float = 8.0  # position error (m) x gain / 5 cm = action
    carry_speed: float = 0.5  # largest position action once the object is held (faster lifts slip)
    tolerance: float = 0.01  # a position target counts as reached within this distance
    close_steps: int = 15  # gripper closing / opening time
    lift_steps: int = 25
    phase_budget: int = 60  # most steps any one moving phase may take


class ScriptedPickPlace:
    """Acts in one ``LiberoTaskEnv`` from its simulator state; ``reset()`` before each episode."""

    def __init__(self, env: Any, settings: Optional[ExpertSettings] = None, noise: float = 0.0,
                 seed: int = 0) -> None:
        self.env = env
        self.settings = settings or ExpertSettings()
        self.noise = float(noise)
        self._rng = np.random.default_rng(seed)
        self._robosuite_env = env._env.env
        goal = self._robosuite_env.parsed_problem["goal_state"]
        if len(goal) != 1 or goal[0][0].lower() != "on":
            raise ValueError(f"the scripted expert handles one (on <object> <target>) goal, not {goal}")
        self.object_name, self.target_name = goal[0][1], goal[0][2]
        self.reset()

    # -- simulator state --
    def _body_position(self, name: str) -> np.ndarray:
        e = self._robosuite_env
        return np.array(e.sim.data.body_xpos[e.obj_body_id[name]], dtype=np.float64)

    def _gripper_position(self) -> np.ndarray:
        e = self._robosuite_env
        return np.array(e.sim.data.site_xpos[e.robots[0].eef_site_id], dtype=np.float64)

    def _choose_grasp_side(self) -> float:
        """-1 or +1: which rim point along y to grasp. The Panda's fingers close along world y in
        LIBERO's start pose, so the rim at +-y from the centre is a wall across that axis; the outer
        finger then lands beyond the rim, and that side must be clear of neighbouring objects."""
        obj = self._body_position(self.object_name)
        others = [self._body_position(n) for n in self._robosuite_env.obj_body_id if n != self.object_name]
        reach = self.settings.rim_offset + 0.045  # outer finger pad, 4.2 cm from the grip point
        clearance = {}
        for side in (-1.0, 1.0):
            finger = obj[:2] + np.array([0.0, side * reach])
            clearance[side] = min((np.linalg.norm(finger - o[:2]) for o in others), default=np.inf)
        return max(clearance, key=lambda k: (clearance[k], -k))  # ties: -y, the side toward the robot

    def reset(self) -> None:
        self._grasp_side = self._choose_grasp_side()
        self.phase = 0
        self._phase_steps = 0
        self._grasp_offset: Optional[np.ndarray] = None  # gripper minus object centre once grasped

    # -- control --
    def _targets(self) -> np.ndarray:
        s = self.settings
        obj = self._body_position(self.object_name)
        name = PHASES[self.phase]
        if name in ("above", "descend", "grasp"):
            grasp = obj + np.array([0.0, self._grasp_side * s.rim_offset, s.grasp_depth])
            if name == "above":
                return grasp + np.array([0.0, 0.0, s.approach_height])
            return grasp
        if self._grasp_offset is None:
            self._grasp_offset = self._gripper_position() - obj
        target = self._body_position(self.target_name)
        carried = target + np.array([self._grasp_offset[0], self._grasp_offset[1], 0.0])
        if name == "lift":
            return self._gripper_position() * np.array([1, 1, 0]) + np.array([0, 0, target[2] + s.carry_height])
        if name == "carry":
            return carried + np.array([0.0, 0.0, s.carry_height])
        if name in ("lower", "release"):
            return carried + np.array([0.0, 0.0, s.place_height])
        return carried + np.array([0.0, 0.0, s.carry_height])  # retreat

    def clean_action(self) -> np.ndarray:
        """The expert's action for the current state, and the phase bookkeeping for the next."""
        s = self.settings
        name = PHASES[self.phase]
        error = self._targets() - self._gripper_position()
        action = np.zeros(7)
        closed = name in ("grasp", "lift", "carry", "lower")
        limit = s.carry_speed if closed else 1.0
        action[:3] = np.clip(error * s.gain / _POSITION_SCALE, -limit, limit)
        action[6] = 1.0 if closed else -1.0
        self._phase_steps += 1
        timed = name in ("grasp", "release")
        if timed:
            done = self._phase_steps >= s.close_steps
        elif name == "lift":
            done = bool(self._phase_steps >= s.lift_steps or np.linalg.norm(error) < s.tolerance)
        else:
            done = bool(np.linalg.norm(error) < s.tolerance or self._phase_steps >= s.phase_budget)
        if done and self.phase < len(PHASES) - 1:
            self.phase += 1
            self._phase_steps = 0
        return action

    def act(self) -> tuple[np.ndarray, np.ndarray]:
        """(executed action, label): the label is the clean command, the executed one has noise."""
        label = self.clean_action()
        executed = label.copy()
        if self.noise > 0:
            executed[:3] = np.clip(executed[:3] + self._rng.normal(0.0, self.noise, 3), -1.0, 1.0)
        return executed, label
